"""Unit tests start no process: a watch over one test that lists the processes it started.

`make check` runs tests/unit while editing and must stay quick; a test that starts a process belongs in
tests/processes, tests/distributed or tests/e2e. Processes are seen through Python's audit events (subprocess,
fork, exec, spawn) and multiprocessing's `Process.start` (whose fork server and spawn raise no event).
"""

from __future__ import annotations

import multiprocessing.process
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system",
                    "os.exec", "pty.spawn"})

_watches: list[tuple[int, list[str]]] = []  # open watches (pid, started): an audit hook cannot be removed


def _heard(event: str, arguments: tuple) -> None:
    if event in EVENTS and _watches and os.getpid() == _watches[-1][0]:
        _watches[-1][1].append(f"{event} {arguments[:2]!r}"[:300])


sys.addaudithook(_heard)


@contextmanager
def watch() -> Iterator[list[str]]:
    """Yields the list of what the body starts, one line each, filled as it goes."""
    opened = (os.getpid(), [])
    original = multiprocessing.process.BaseProcess.start

    def start(process):
        opened[1].append(f"multiprocessing.Process {process.name!r}")
        return original(process)

    multiprocessing.process.BaseProcess.start = start
    _watches.append(opened)
    try:
        yield opened[1]
    finally:
        _watches.remove(opened)
        multiprocessing.process.BaseProcess.start = original
