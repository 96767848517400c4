"""Temporaries that outlive no one: named by their owner, swept once the owner is gone.

A share cache being copied and a dataset being imported live under temporary names until they
are complete. Cleanup that runs on the way out (`finally`, `atexit`, finalizers) is skipped by
SIGKILL, by a worker's `os._exit` on a stop signal and by the default action of SIGTERM, so a
temporary name alone leaks on every interrupt. Each temporary name therefore carries its owner,
`<stem>.<host>.<pid>.<random>.tmp`: whoever next writes to the same folder removes those whose
owner process has ended on this host (`sweep`), whatever killed it. The host in the name keeps
a process on another machine sharing the folder from judging a pid it cannot see.

While a dataset is written in the main thread, SIGTERM and SIGHUP (whose default action ends
the process without unwinding) first remove the temporaries held, then end the process with
the same signal, so its exit status is unchanged (`remove_on_stop`). SIGINT already unwinds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import uuid

import psutil

HOST = socket.gethostname()
SUFFIX = ".tmp"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def owned_name(stem: str, pid: int | None = None) -> str:
    """A temporary name for `stem` that says which process (this one by default) on which host owns it."""
    return f"{stem}.{HOST}.{os.getpid() if pid is None else pid}.{uuid.uuid4().hex[:8]}{SUFFIX}"


def owner(name: str) -> int | None:
    """The pid of the process on this host that owns the temporary `name`; None when it is not one."""
    if not name.endswith(SUFFIX):
        return None
    parts = name[: -len(SUFFIX)].rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[0].endswith(f".{HOST}"):
        return None
    return int(parts[1])


def sweep(folder: str, prefix: str, ended: tuple[int, ...] = ()) -> list[str]:
    """Remove the temporaries in `folder` whose names begin with `prefix` and whose owner has ended (or is
    in `ended`: known gone before the kernel says so)."""
    try:
        names = os.listdir(folder)
    except OSError:  # not there yet, or not readable: nothing of ours to remove
        return []
    removed = []
    for name in names:
        pid = owner(name) if name.startswith(prefix) else None
        path = os.path.join(folder, name)
        # a link is not a temporary shoal made
        if pid is None or (pid not in ended and _alive(pid)) or os.path.islink(path):
            continue
        remove(path)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    """Whether `pid` runs: another user's process counts, a killed one its parent has not yet reaped does not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to look at: alive
        return True


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


_held: set[str] = set()
_replaced: dict[int, object] = {}  # signal -> the handler ours stands in for
_lock = threading.Lock()


def remove_on_stop(path: str) -> None:
    """Remove `path` if SIGTERM or SIGHUP ends the process before `release(path)`.

    Only where the signal's action is the default one: a program with its own handler decides
    (an exception it raises unwinds through the writer, which removes its temporary), and a
    signal ignored stays ignored. Handlers can be set in the main thread only; elsewhere the
    next `sweep` is what removes a killed writer's temporary.
    """
    with _lock:
        if not _held and threading.current_thread() is threading.main_thread():
            for number in STOP_SIGNALS:
                if signal.getsignal(number) is signal.SIG_DFL:
                    _replaced[number] = signal.signal(number, _stopped)
        _held.add(path)


def release(path: str) -> None:
    """`path` is finished or removed: a stop signal no longer concerns it."""
    with _lock:
        _held.discard(path)
        if not _held:
            _restore()


def _restore() -> None:
    for number, handler in _replaced.items():
        if signal.getsignal(number) is _stopped:  # a handler set since then stays
            signal.signal(number, handler)
    _replaced.clear()


def _stopped(number: int, frame) -> None:
    """Remove what is held, then let the signal end the process as it would have."""
    for path in list(_held):
        remove(path)
    _held.clear()
    _restore()
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
