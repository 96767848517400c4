"""The worker entry point that every process of a job runs (SPMD).

`shoal train` starts it through torch's elastic launcher; users of torchrun, srun or mpirun
start it directly: `torchrun --nproc-per-node 4 -m shoal.worker job.toml`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import faulthandler
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from shoal.cluster.collectives import Communicator
from shoal.cluster.env import choose_device, get_dist_info, init_process_group, threads_per_worker
from shoal.cluster.environments import Slurm, detect, named
from shoal.cluster.heartbeat import silence
from shoal.cluster.orphan import end_with_parent
from shoal.cluster.regroup import Regroup, regroup_stop
from shoal.cluster.requeue import EXIT_REQUEUED, EpochEndStop, StopRequested, requeue
from shoal.code import TRACEBACK_LINES, USER_TRACEBACK, user_traceback, with_file_names
from shoal.durable import write_bytes_durably
from shoal.errors import CONSEQUENCE, PeerLost, ShoalError, WorkerError, first_line, lost_peer
from shoal.events import JobEnd, append_event
from shoal.jobs import load_job
from shoal.objects import load_object
from shoal.process import end_process, say
from shoal.train.exits import outside_recorder
from shoal.train.runner import run_worker
from shoal.train.uncompiled import defer_compiler


def run(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m shoal.worker", description=__doc__)
    parser.add_argument("job", help="the job file (TOML)")
    parser.add_argument("--run-dir", help="where the job writes; decided by rank 0 when absent")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--threads", type=int, help="compute threads (default: cores / local workers)")
    parser.add_argument("--resume", action="store_true", help="continue from the run directory's newest checkpoint")
    parser.add_argument("--callbacks", help="a file of callbacks written by shoal.fit (loading it runs its code)")
    args = parser.parse_args(argv)
    defer_compiler()  # a worker compiles nothing unless its model does: 1.5 s of start-up saved
    launcher = detect(os.environ)
    # a worker whose launcher died (SIGKILL included) must not train on alone
    end_with_parent(launcher=launcher.launcher_pid() if launcher else None)
    info = get_dist_info()
    job = load_job(args.job, args.overrides)
    threads = args.threads or threads_per_worker(job.cluster.threads, info.local_world_size)
    torch.set_num_threads(threads)
    info = init_process_group(info, choose_device(job.cluster.device, info), job.cluster.timeout,
                              requested=job.cluster.device)
    device = choose_device(job.cluster.device, info)  # as the ranks agreed
    recorder = outside_recorder(info)  # under torchrun, srun or mpirun the workers record failures themselves
    stop = slurm_warning(info, fixed_run_dir=bool(args.run_dir or job.output.run_dir)) or \
        regroup_stop()
    held = contextlib.ExitStack()
    try:
        chosen = Path(args.run_dir) if args.run_dir else (new_run(job) if info.rank == 0 else None)
        decided = Path(Communicator(info.rank, info.world_size, device=device).broadcast_object(str(chosen)))
        run_dir = Path(args.run_dir) if args.run_dir else decided  # a rank told its folder keeps it (its machine's)
        # restarted by torchrun's own agent, or requeued by SLURM: continue from the newest checkpoint
        resume = args.resume or info.restarts > 0 or info.requeued > 0
        if info.rank == 0 and not named(info.launcher).holds_run_dir:  # torchrun, srun or mpirun
            held.enter_context(launched(job, run_dir, resume))
        if recorder is not None:
            recorder.started(run_dir)
        # rank 0 calls them
        callbacks = with_file_names(load_object(args.callbacks, "--callbacks")) if args.callbacks else []
        return run_worker(job, info, run_dir, threads, resume=resume, stop=stop, callbacks=callbacks,
                          on_stall=leave_for_stalled_peer(info.rank, recorder))
    except StopRequested as stopped:
        if isinstance(stop, Regroup):  # machines join: the launcher starts the job again with them
            stop.stopped(info.rank, stopped.epochs_done)
            return {}
        stop_for_requeue(info, run_dir, recorder, stopped)
        raise
    except Exception as error:
        if recorder is not None:
            recorder.failed(first_line(error), user_traceback(error, TRACEBACK_LINES), consequence=lost_peer(error))
        raise
    finally:
        held.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def new_run(job) -> Path:
    """Rank 0's choice of a new run's directory where no launcher of shoal's chose it (shoal.launching's rule)."""
    from shoal.launching import new_run_directory  # under torchrun, srun or mpirun only

    return new_run_directory(job)


@contextlib.contextmanager
def launched(job, run_dir: Path, resume: bool):
    """What shoal's launcher does before its workers start, done by rank 0 under torchrun, srun or mpirun
    (shoal.launching.Launch): hold the run directory for the whole job, and write the resolved job file there,
    keeping one already written (a restarted or requeued job's)."""
    from shoal.launching import Launch  # under torchrun, srun or mpirun only

    launch = Launch(copy.deepcopy(job), run_dir, resume=resume)  # this worker trains on the job as it loaded it
    with launch.hold():
        launch.write(replace=False)
        yield


def leave_for_stalled_peer(rank: int, recorder):
    """What this worker does once another went cluster.stall_timeout without a heartbeat, or stuck at one step
    while this one waited for it (`quiet`, the verdict): its collective would wait cluster.timeout for it, so
    it leaves now, as a worker that lost a peer leaves, and its launcher ends the attempt (restarts or stops
    the job). The main thread waits in C++, where nothing reaches it: the heartbeat's thread records the
    failure and ends the process."""
    def leave(quiet: dict) -> None:
        message = f"worker rank {quiet['rank']} on {quiet['host']} {silence(quiet)}; rank {rank} waited for it"
        try:
            record_failure(PeerLost(message))
            if recorder is not None:  # under torchrun, srun or mpirun: this worker's exit, for rank 0's record
                recorder.failed(message, consequence=True)
            say(f"shoal worker {rank}: stopping: {message}")
        finally:  # whatever happened above, this worker must not wait on
            end_process(1)

    return leave


def slurm_warning(info, fixed_run_dir: bool) -> EpochEndStop | None:
    """Under srun: SLURM's warning before the time limit (SIGUSR1) ends the job at an epoch's end."""
    if info.launcher != Slurm.name:
        return None
    if info.rank == 0 and not fixed_run_dir:
        print("shoal worker 0: warning: no --run-dir: a requeued job would start a new run, not continue this one",
              file=sys.stderr, flush=True)
    return EpochEndStop().install()


def stop_for_requeue(info, run_dir: Path, recorder, stopped: StopRequested) -> None:
    """Every rank stopped at the same epoch's end: record it, then ask SLURM to requeue the job."""
    if recorder is not None:  # the requeue's SIGTERM must not read as a failure
        recorder.leave_quietly(EXIT_REQUEUED)
    if info.rank == 0:
        append_event(run_dir, JobEnd(status="interrupted", message=str(stopped)))
    if dist.is_initialized():
        dist.barrier()  # every rank stays until the stop is recorded (srun may end a step at the first exit)
    if info.rank == 0:
        say(f"shoal: {stopped}; {requeue(os.environ.get('SLURM_JOB_ID'))}")


def main(argv: list[str] | None = None) -> int:
    """Run, recording a failure where the elastic launcher reads it (rank, host, message)."""
    faulthandler.enable(all_threads=True)  # a crash in native code still prints every thread's stack
    try:
        run(argv)
    except (ShoalError, WorkerError) as error:  # a user error, or a job's failure this worker saw: one line
        record_failure(error)
        if (frames := user_traceback(error)) is not None:  # the user's own frames, to debug by
            print(frames, file=sys.stderr)
        say(f"shoal worker {os.environ.get('RANK', '0')}: error: {error}")
        return error.exit_code
    except StopRequested:
        return EXIT_REQUEUED
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        record_failure(error)
        if not _lost_a_peer(error):
            raise  # the worker's own failure: its whole traceback
        # a consequence of another worker's end, which the launcher names: one line, not gloo's traceback
        say(f"shoal worker {os.environ.get('RANK', '0')}: stopping: another worker is gone ({_peer_reason(error)})")
        return 1
    return 0


def _lost_a_peer(error: BaseException) -> bool:
    """Whether `error` only says that another worker went away (`lost_peer`); SHOAL_DEBUG_LAUNCH keeps the
    traceback."""
    return lost_peer(error) and not os.environ.get("SHOAL_DEBUG_LAUNCH")


def _peer_reason(error: BaseException) -> str:
    """gloo's message without its source location and advice: 'Connection closed by peer [127.0.0.1]:22914'."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", first_line(error))
    return text.split(". ")[0].rstrip(".")


def record_failure(error: BaseException) -> None:
    """The failure, as torch's elastic agent reads it from TORCHELASTIC_ERROR_FILE, written whole or not at all:
    torch's own writer truncates the file first, and a worker stopped between the two (the agent stops the
    others when one dies) left an empty file that the agent's own reader then crashed on, ending the job
    instead of restarting it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    message = {"message": f"{type(error).__name__}: {error}",
               "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}}
    if (frames := user_traceback(error, TRACEBACK_LINES)) is not None:  # for job_end, by the launcher
        message["extraInfo"][USER_TRACEBACK] = frames
    record = {"message": message, CONSEQUENCE: lost_peer(error)}  # told by type here: the launcher has only this
    with contextlib.suppress(OSError):  # the failure itself is what matters; it is printed either way
        write_bytes_durably(path, json.dumps(record).encode())


if __name__ == "__main__":
    status = main()
    if status in (0, EXIT_REQUEUED):  # stopped for a requeue, every rank past the barrier: as written and closed
        end_process(status)  # the run is written and closed; skip the interpreter's teardown
    sys.exit(status)
