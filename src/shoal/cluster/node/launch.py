"""Starting this node's workers for one attempt, through torch's elastic agent.

Launching is apart from training: this module starts `python -m shoal.worker` processes (forked
from the fork server it is handed, shoal.cluster.node.forkserver, where the caller started one) and
turns their failures into one description naming the rank and host; it knows nothing about models
or data, and nothing about other machines beyond the rendezvous handler it is given (see
shoal.cluster.node.rendezvous, which agrees on node ranks and attempts beforehand).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
from pathlib import Path

import psutil
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import RendezvousHandler

from shoal.cluster import scratch
from shoal.cluster.environments import ShoalLauncher
from shoal.cluster.node import forkserver
from shoal.cluster.node.agent import SHUTDOWN_SECONDS, NodeAgent
from shoal.cluster.signals import Interrupted, caller_signal_handlers, handled_signals
from shoal.cluster.verdict import Account, Kind, root_cause
from shoal.code import USER_TRACEBACK
from shoal.errors import CONSEQUENCE, EXIT_USAGE, WorkerError, torch_says
from shoal.events import JobRestarted, WorkerFailed

WORKER_MODULE = forkserver.WORKER_MODULE
# set (to anything): workers start as functions from multiprocessing's forkserver, for benchmarks.startup only
TORCH_FORKSERVER = "SHOAL_TORCH_FORKSERVER"


def launch(job_file: Path, run_dir: Path, *, workers: int, threads: int, rendezvous: RendezvousHandler,
           resume: bool = False, callbacks: Path | None = None, server: forkserver.ForkServer | None = None,
           counts: list[int] | None = None) -> None:
    """Run `workers` local worker processes of the job to completion; raise WorkerError on failure.

    `counts`: every node's worker count by node rank, which numbers the job's ranks (None: every node runs
    `workers`). With a fork `server` the workers are forked from it, already imported; without one each
    starts afresh."""
    variables = {
        "OMP_NUM_THREADS": str(threads),
        **ShoalLauncher.variables(os.getpid()),  # its workers know it, and end themselves once it is gone
        "TORCHELASTIC_SIGNALS_TO_HANDLE": handled_signals(),
    }
    arguments = [str(job_file), "--run-dir", str(run_dir), "--threads", str(threads)]
    if resume:
        arguments.append("--resume")
    if callbacks is not None:
        arguments += ["--callbacks", str(callbacks)]
    # torch's default log folder is a /tmp/torchelastic_* left behind by every job; ours is named by this
    # process, so a later launch (or the fork server) removes it should this one be killed outright
    scratch.sweep()
    logs = scratch.make(scratch.LOGS)
    try:
        agent = make_agent(rendezvous, workers, arguments, logs, server, variables, counts)
        with _quiet_elastic(), caller_signal_handlers(), workers_environment(variables):
            result = agent.run()
        if result.is_failed():
            raise describe_failure(ChildFailedError(name=WORKER_MODULE, failures=result.failures))
    except SignalException as error:  # Ctrl-C or SIGTERM: the agent has stopped the workers
        raise Interrupted(error.sigval) from None
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def make_agent(rendezvous: RendezvousHandler, workers: int, arguments: list[str], logs: str,
               server: forkserver.ForkServer | None = None, variables: dict[str, str] | None = None,
               counts: list[int] | None = None) -> NodeAgent:
    """The agent for one attempt: each worker a `python -m shoal.worker` process (through the fork `server`'s
    stand-ins where there is one), or, with TORCH_FORKSERVER set, a call of `worker_function` in a process
    forked by multiprocessing's own forkserver (benchmarks.startup compares the two; not for users). The
    workers' ranks follow every node's worker count (`counts`, by node rank; None: all run `workers`)."""
    if os.environ.get(TORCH_FORKSERVER):
        entrypoint, start_method = worker_function, "forkserver"
        arguments = [json.dumps(variables or {}), *arguments]
    else:
        entrypoint, start_method = sys.executable, "spawn"
        arguments = server.arguments(arguments) if server else ["-u", "-m", WORKER_MODULE, *arguments]
    spec = WorkerSpec(role="worker", local_world_size=workers, entrypoint=entrypoint, args=tuple(arguments),
                      rdzv_handler=rendezvous, max_restarts=0, monitor_interval=0.1)
    return NodeAgent(spec, logs_specs=DefaultLogsSpecs(log_dir=logs), start_method=start_method,
                     shutdown_timeout=SHUTDOWN_SECONDS, counts=counts)


def worker_function(variables: str, *arguments: str) -> None:
    """A worker as a function, in a process that multiprocessing's forkserver forked with the worker module
    imported (`multiprocessing.set_forkserver_preload`); torch's agent has set its own variables, not the
    launcher's (`variables`, JSON): that server's environment is the launcher's as it started it."""
    os.environ.update(json.loads(variables))
    os.environ.update(ShoalLauncher.variables(os.getppid()))  # its parent, the forkserver, ends with the launcher
    status = importlib.import_module(WORKER_MODULE).main(list(arguments))
    if status:
        sys.exit(status)


@contextlib.contextmanager
def workers_environment(variables: dict[str, str]):
    """The workers' variables, set only while the agent runs (it hands its workers a copy of this
    process's environment). A caller that launches in-process (shoal.fit) gets its environment back
    as it was, or a torchrun it starts later would take its workers for shoal's own."""
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _quiet_elastic():
    """shoal reports failures itself, in one line; SHOAL_DEBUG_LAUNCH shows torch's own account."""
    quiet = logging.getLogger("torch.distributed.elastic")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL if not os.environ.get("SHOAL_DEBUG_LAUNCH") else logging.INFO)
    try:
        yield
    finally:
        quiet.setLevel(level)


def stop_workers(number: int = signal.SIGTERM) -> int:
    """Signal this launcher's workers (another node failed, or the job ended); how many were signalled.

    A stopped or wedged worker ignores SIGTERM and the agent, seeing it alive, would wait for ever:
    the caller sends SIGKILL after SHUTDOWN_SECONDS."""
    count = 0
    for child in psutil.Process().children():
        try:
            if _runs_a_worker(child.cmdline()):
                child.send_signal(number)
                count += 1
        except psutil.Error:  # ended meanwhile
            continue
    return count


def _runs_a_worker(command: list[str]) -> bool:
    """Whether a child's command line runs the worker module or a worker's stand-in (the fork server's names the
    worker module too, but as the module it imports: it goes when its launcher tells it)."""
    modules = {command[index + 1] for index, word in enumerate(command[:-1]) if word == "-m"}
    return bool(modules & {WORKER_MODULE, forkserver.STAND_IN})


def _wrote_error(failure) -> bool:
    """Whether the worker recorded an exception (torch's error file); killed ones write none, and
    torch then fills `error_file_data` with a placeholder that is not empty."""
    return isinstance(failure.error_file_data.get("message"), dict)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time or unnamed signal
        return f"signal {number}"


def _followed(failure) -> bool:
    """Whether a worker's recorded error only followed a peer's loss: as the worker said (shoal.worker writes
    the `consequence` entry, judged by the error's type), else, in a record shoal's worker did not write, by
    torch's words for a lost peer in its message."""
    if not _wrote_error(failure):
        return False
    said = failure.error_file_data.get(CONSEQUENCE)
    if isinstance(said, bool):
        return said
    return torch_says(str(failure.error_file_data["message"].get("message", "")))


def _kind(failure) -> Kind:
    """One failed worker's account for the verdict, from torch's record of it."""
    if _wrote_error(failure) and not _followed(failure):
        return Kind.RAISED
    if failure.exitcode < 0 and failure.exitcode != -signal.SIGTERM:  # SIGTERM: the launcher stopping the others
        return Kind.KILLED
    return Kind.FOLLOWED


def describe_failure(error: ChildFailedError) -> WorkerError:
    """The root cause among this node's failed workers, as one line and as the `worker_failed` event.

    Named by shoal.cluster.verdict's order (a worker that raised, then one killed, then the earliest);
    the error's `consequence` says that every one of them only failed because of something elsewhere
    (a lost peer, or stopped by its launcher), so another node holds the cause.
    """
    failures = sorted(error.failures.items(), key=lambda item: item[1].timestamp)
    cause = root_cause([Account(_kind(failure), rank=rank, details=failure) for rank, failure in failures])
    rank, failure = cause.rank, cause.details
    message = failure.message
    if isinstance(message, dict):  # the error file's {"message": ..., "extraInfo": {traceback}}
        message = message.get("message", "")
    message = str(message).strip().splitlines()[0] if message else f"exit status {failure.exitcode}"
    host = socket.gethostname()
    signal_name = None
    if failure.exitcode < 0:
        signal_name = _signal_name(-failure.exitcode)
        message = f"killed by {signal_name}"
    worker_error = WorkerError(f"worker rank {rank} on {host} failed: {message}")
    worker_error.exit_code = EXIT_USAGE if failure.exitcode == EXIT_USAGE else 1
    # only lost peers and workers the launcher stopped: the cause lies with another node
    worker_error.consequence = all(_followed(failure) or failure.exitcode == -signal.SIGTERM
                                   for failure in error.failures.values())
    worker_error.failure = WorkerFailed(rank=rank, host=host, exit_code=failure.exitcode, signal=signal_name,
                                        message=message)
    worker_error.user_traceback = _user_traceback(failure)  # an error in the user's code: for job_end
    return worker_error


def _user_traceback(failure) -> str | None:
    """The traceback of the user's own code that a worker wrote into its error file (shoal.worker), if any."""
    written = failure.error_file_data.get("message") if isinstance(failure.error_file_data, dict) else None
    extra = written.get("extraInfo") if isinstance(written, dict) else None
    found = extra.get(USER_TRACEBACK) if isinstance(extra, dict) else None
    return found if isinstance(found, str) else None


def restart_line(failure: str, restart: JobRestarted, max_restarts: int) -> str:
    """What the launcher says as it restarts the workers: the failure (rank, host, how it ended), and where
    the job goes on from."""
    return f"shoal: {failure}; restarting from {restart_start(restart)}, restart {restart.restart} of {max_restarts}"


def restart_start(restart: JobRestarted) -> str:
    """Where a restart goes on from, in words."""
    return f"epoch {restart.from_epoch}'s checkpoint" if restart.from_epoch else "the start (no checkpoint yet)"
