"""One job per run directory: an advisory lock that the launcher holds for the whole job.

Two jobs in one run directory (a `--resume` of a run still going) write the same checkpoints,
events and job file. The lock is `flock` on RUN_DIR/.lock: the kernel drops it when its holder
dies, however it dies, so a killed job never keeps its run directory; and it works across
machines on a shared filesystem (NFS emulates it with its own locks). The file names its
holder (pid and host) so the job turned away learns which one to wait for.

Taking the lock is also where a run directory is first looked at, so a symbolic link where shoal
keeps one of its files or folders is refused here, before anything is written through it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from shoal.errors import ConfigError
from shoal.safe_files import open_file, refuse_link

LOCK_FILE = ".lock"
KEPT = (LOCK_FILE, "job.toml", "events.jsonl", "model.pt", "metrics.csv", "report.md", "checkpoints", "tensorboard",
        "mlruns", "mlflow.json")
"""What shoal writes in a run directory (named here, not imported: the writers pull in torch)."""


@contextlib.contextmanager
def hold_run_dir(run_dir: str | Path) -> Iterator[Path]:
    """Hold the run directory (created when missing) until the block ends; another holder is a ConfigError.

    Never waits: a run directory in use is refused at once, naming the job that holds it.
    """
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            refuse_link(run_dir / name)
        descriptor = open_file(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    except OSError as error:
        raise ConfigError(f"{run_dir}: cannot use as a run directory: {error.strerror}") from None
    try:
        if _lock(run_dir, descriptor):
            _name_holder(descriptor)
        yield run_dir
    finally:
        os.close(descriptor)  # closing the only descriptor releases the lock


def _lock(run_dir: Path, descriptor: int) -> bool:
    """Take the lock without waiting; False where the filesystem has no locks (the job goes on unguarded)."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ConfigError(f"{run_dir}: in use by another shoal job ({_holder(descriptor)}); "
                          "wait for it or choose another --run-dir") from None
    except OSError as error:  # ENOLCK, EOPNOTSUPP: a filesystem mounted without locks
        print(f"shoal: warning: {run_dir}: cannot lock the run directory ({error.strerror}); nothing keeps "
              "a second job out of it", file=sys.stderr)
        return False
    return True


def _name_holder(descriptor: int) -> None:
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)


def _holder(descriptor: int) -> str:
    """`pid N on HOST` as the holder wrote it; it may be a moment from writing it after taking the lock."""
    for _ in range(10):
        fields = os.pread(descriptor, 4096, 0).decode("utf-8", "replace").split()
        if len(fields) == 2:
            return f"pid {fields[0]} on {fields[1]}"
        time.sleep(0.05)
    return "its pid not yet written"
