"""Starting workers: N local processes through torch's elastic launcher, or one node of many.

Launching is apart from training: this module starts `python -m shoal.worker` processes and
turns their failures into one message naming the rank and host; it knows nothing about
models or data. A single machine uses a c10d rendezvous on 127.0.0.1 with a free port; a
cluster passes torchrun's node arguments through.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from shoal.cluster.heartbeat import HEARTBEAT_SECONDS, fell_silent
from shoal.cluster.orphan import LAUNCHER_VARIABLE
from shoal.errors import EXIT_USAGE, ConfigError, WorkerError
from shoal.events import WorkerFailed

SHUTDOWN_SECONDS = 5  # after SIGTERM, how long workers get before SIGKILL
ELASTIC_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # the signals torch's agent handles


@dataclass
class Nodes:
    """Where this node stands in a multi-machine job (torchrun's arguments)."""

    count: int = 1
    rank: int | None = None
    endpoint: str | None = None
    run_id: str | None = None
    backend: str | None = None

    def rendezvous(self) -> tuple[str, str, dict]:
        """(backend, endpoint, configs) for the elastic launcher."""
        if self.count == 1 and self.endpoint is None:
            return "c10d", "127.0.0.1:0", {}
        if self.endpoint is None:
            raise ConfigError("--rdzv-endpoint: HOST:PORT is required when --nnodes > 1")
        backend = self.backend or ("static" if self.rank is not None else "c10d")
        configs = {"rank": self.rank} if backend == "static" else {}
        return backend, self.endpoint, configs


def launch(job_file: Path, run_dir: Path, *, workers: int, threads: int, nodes: Nodes | None = None,
           resume: bool = False) -> None:
    """Run `workers` local worker processes of the job to completion; raise WorkerError on failure."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ[LAUNCHER_VARIABLE] = str(os.getpid())  # its workers end themselves once it is gone
    arguments = ["-u", "-m", "shoal.worker", str(job_file), "--run-dir", str(run_dir), "--threads", str(threads)]
    if resume:
        arguments.append("--resume")
    # torch's default log folder is a /tmp/torchelastic_* left behind by every job
    logs = tempfile.mkdtemp(prefix="shoal-launch-")
    try:
        config = launch_config(nodes or Nodes(), workers, logs, handled_signals())  # raises only ConfigError
        with _quiet_elastic(), _caller_signal_handlers():
            elastic_launch(config, sys.executable)(*arguments)
    except ChildFailedError as error:
        raise describe_failure(error, run_dir) from None
    except SignalException as error:  # Ctrl-C or SIGTERM: the agent has stopped the workers
        raise Interrupted(error.sigval) from None
    except (RuntimeError, ValueError, TimeoutError, OSError) as error:  # rendezvous or store: workers never ran
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise WorkerError(f"could not start the workers through rendezvous {config.rdzv_endpoint}: {reason}") \
            from None
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def launch_config(nodes: Nodes, workers: int, logs: str, signals: str) -> LaunchConfig:
    """torch's elastic launch of this node's workers: rendezvous, no restarts of its own, logs in `logs`,
    `signals` (comma-separated names) stopping the workers."""
    backend, endpoint, configs = nodes.rendezvous()
    return LaunchConfig(
        min_nodes=nodes.count,
        max_nodes=nodes.count,
        nproc_per_node=workers,
        # all nodes of a job must name the same run; a lone machine gets a fresh one
        run_id=nodes.run_id or ("shoal" if nodes.count > 1 else f"shoal-{uuid.uuid4().hex[:12]}"),
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=configs,
        max_restarts=0,  # shoal restarts whole jobs itself, recording why (see shoal.api.start)
        monitor_interval=0.1,
        shutdown_timeout=SHUTDOWN_SECONDS,
        start_method="spawn",
        local_addr="127.0.0.1" if nodes.count == 1 else None,
        logs_specs=DefaultLogsSpecs(log_dir=logs),
        signals_to_handle=signals,
    )


def handled_signals() -> str:
    """The signals torch's agent may take over: a signal the caller ignores (SIGHUP under nohup) stays ignored."""
    return ",".join(name for name in ELASTIC_SIGNALS if signal.getsignal(getattr(signal, name)) is not signal.SIG_IGN)


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


@contextlib.contextmanager
def _caller_signal_handlers():
    """torch's agent takes over its signals and never gives them back: the caller's return after the job
    (a notebook's Ctrl-C, a service's SIGTERM)."""
    saved = {name: signal.getsignal(getattr(signal, name)) for name in ELASTIC_SIGNALS}
    try:
        yield
    finally:
        for name, handler in saved.items():
            if handler is None:  # installed outside Python: nothing to put back
                continue
            try:
                signal.signal(getattr(signal, name), handler)
            except ValueError:  # not the main thread, where torch installed none either
                pass


class Interrupted(Exception):
    """The job was stopped by a signal; `exit_code` is 128 + its number (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, signal_number: int):
        self.signal = signal.Signals(signal_number)
        self.exit_code = 128 + int(signal_number)
        super().__init__(f"stopped by {self.signal.name}")


def _lost_peer(message: str) -> bool:
    """A worker's error that only says another worker went away: a consequence, not the cause."""
    consequences = ("Connection reset by peer", "Connection closed by peer", "remote process exited",
                    "communicator was aborted", "NCCL communicator", "DistBackendError")
    return any(text in message for text in consequences)


def _wrote_error(failure) -> bool:
    """Whether the worker recorded an exception (torch's error file); killed ones write none, and
    torch then fills `error_file_data` with a placeholder that is not empty."""
    return isinstance(failure.error_file_data.get("message"), dict)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time or unnamed signal
        return f"signal {number}"


def describe_failure(error: ChildFailedError, run_dir: Path) -> WorkerError:
    """The root cause among failed workers, as one line and as the `worker_failed` event.

    A worker that stopped answering makes another one's collective time out: the heartbeats
    name the one that went quiet first. Otherwise a worker that raised is preferred over ones
    that were killed as a consequence.
    """
    failures = sorted(error.failures.items(), key=lambda item: item[1].timestamp)
    raised = [(rank, failure) for rank, failure in failures
              if _wrote_error(failure) and not _lost_peer(str(failure.message))]
    # SIGTERM is what the launcher sends the others once one has failed
    killed = [(rank, failure) for rank, failure in failures if failure.exitcode < 0 and failure.exitcode != -15]
    rank, failure = (raised or killed or failures)[0]
    message = failure.message
    if isinstance(message, dict):  # the error file's {"message": ..., "extraInfo": {traceback}}
        message = message.get("message", "")
    message = str(message).strip().splitlines()[0] if message else f"exit status {failure.exitcode}"
    host = socket.gethostname()
    signal_name = None
    if failure.exitcode < 0:
        signal_name = _signal_name(-failure.exitcode)
        message = f"killed by {signal_name}"
    text = f"worker rank {rank} on {host} failed: {message}"
    quiet = fell_silent(run_dir, gap=2 * HEARTBEAT_SECONDS)
    if quiet is not None:
        text = (f"worker rank {quiet['rank']} on {quiet['host']} stopped answering at step {quiet['step']} "
                f"and was ended; the others waited for it (rank {rank}: {message})")
        rank, host = quiet["rank"], quiet["host"]
    worker_error = WorkerError(text)
    worker_error.exit_code = EXIT_USAGE if failure.exitcode == EXIT_USAGE else 1
    worker_error.failure = WorkerFailed(rank=rank, host=host, exit_code=failure.exitcode, signal=signal_name,
                                        message=message)
    return worker_error
