"""One job per run directory: an advisory lock that the launcher holds for the whole job.

Two jobs in one run directory (a `--resume` of a run still going) write the same checkpoints,
events and job file. The lock is `flock` on RUN_DIR/.lock: the kernel drops it when its holder
dies, however it dies, so a killed job never keeps its run directory; and it works across
machines on a shared filesystem (NFS emulates it with its own locks). The file names its
holder (pid and host) so the job turned away learns which one to wait for.

Taking the lock is also where a run directory is first looked at, so a symbolic link where shoal
keeps one of its files or folders is refused here, before anything is written through it.

The lock also tells a reader (`shoal status`) whether the job is still there: a free lock is a job
whose launcher is gone, however it ended (`held`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from shoal.errors import ConfigError
from shoal.safe_files import open_file, refuse_link

LOCK_FILE = ".lock"
RESTARTABLE = "restartable"
"""The lock file's third word when its holder is a worker that its launcher (torchrun) may start again: then a
free lock is no sign that the job is gone."""
TRIES = 5
"""Takes of a lock found held, 20 ms apart, before a job is turned away: a reader's look (`held`) holds it
for an instant."""
KEPT = (LOCK_FILE, "job.toml", "events.jsonl", "model.pt", "metrics.csv", "report.md", "checkpoints", "tensorboard",
        "mlruns", "mlflow.json")
"""What shoal writes in a run directory (named here, not imported: the writers pull in torch)."""


@contextlib.contextmanager
def hold_run_dir(run_dir: str | Path) -> Iterator[Path]:
    """Hold the run directory (created when missing) until the block ends; another holder is a ConfigError.

    Never waits (but for a reader's instant, `TRIES`): a run directory in use is refused at once, naming the
    job that holds it.
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
    """Take the lock without waiting (but for a reader's instant); False where the filesystem has no locks
    (the job goes on unguarded)."""
    try:
        _take(descriptor)
    except BlockingIOError:
        raise ConfigError(f"{run_dir}: in use by another shoal job ({_holder(descriptor)}); "
                          "wait for it or choose another --run-dir") from None
    except OSError as error:  # ENOLCK, EOPNOTSUPP: a filesystem mounted without locks
        print(f"shoal: warning: {run_dir}: cannot lock the run directory ({error.strerror}); nothing keeps "
              "a second job out of it", file=sys.stderr)
        return False
    return True


def _take(descriptor: int) -> None:
    """The lock, exclusive, tried TRIES times; BlockingIOError when another holds it all along."""
    for _ in range(TRIES - 1):
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.02)
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)


def held(run_dir: str | Path) -> bool | None:
    """Whether a job holds the run directory now: True; False when its lock is free (the job that held it is
    gone, however it ended); None where no lock says (no lock file: a run written before it, or a machine
    whose job is held elsewhere; a filesystem without locks).

    Only looks: the lock file is opened read-only, never created, never through a link, and a free lock is
    taken shared and let go of at once (a job starting meanwhile tries again: `TRIES`). A free lock last held
    by a worker that torchrun may restart says nothing either (None).
    """
    try:
        descriptor = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None if RESTARTABLE in _words(descriptor)[2:] else False
    except BlockingIOError:
        return True
    except OSError:  # a filesystem without locks
        return None
    finally:
        os.close(descriptor)  # lets go of the shared lock


def _name_holder(descriptor: int) -> None:
    """`PID HOST`, and RESTARTABLE for a worker with torchrun's restarts left (its lock goes free between them)."""
    os.ftruncate(descriptor, 0)
    restartable = f" {RESTARTABLE}" if _restarts_left() else ""
    os.pwrite(descriptor, f"{os.getpid()} {socket.gethostname()}{restartable}\n".encode(), 0)


def _restarts_left() -> bool:
    """Whether this process is a worker that torchrun will start again should it fail."""
    names = ("TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT")
    try:
        most, done = (int(os.environ.get(name, 0)) for name in names)
    except ValueError:
        return False
    return most > done


def _words(descriptor: int) -> list[str]:
    return os.pread(descriptor, 4096, 0).decode("utf-8", "replace").split()


def _holder(descriptor: int) -> str:
    """`pid N on HOST` as the holder wrote it; it may be a moment from writing it after taking the lock."""
    for _ in range(10):
        fields = _words(descriptor)
        if len(fields) >= 2:
            return f"pid {fields[0]} on {fields[1]}"
        time.sleep(0.05)
    return "its pid not yet written"
