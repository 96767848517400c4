"""A worker ends itself when its launcher dies.

torch's launcher starts workers in sessions of their own, so a launcher killed with SIGKILL
(or lost with its machine's terminal) takes no worker with it: they would train on alone and
could even write the model. Each worker watches its parent instead: once the process that
started it is gone (the kernel hands the orphan to init or a subreaper), it stops at once,
writing nothing more. Polling the parent's pid is used rather than PR_SET_PDEATHSIG, which fires
when the launcher's starting *thread* ends, not the launcher. A worker forked by `shoal train`'s fork
server (shoal.cluster.node.forkserver) has the server for its parent and launcher, and the server ends as
soon as the launcher does. Which launcher a worker ends with is its environment's to say
(shoal.cluster.environments: `launcher_pid`); this module reads no launcher's variables.

A helper process that its starting thread waits on (a `shoal predict` pool worker) uses the kernel's
PR_SET_PDEATHSIG instead (`die_with_parent`): the starting thread outlives the helper there, and the
kernel's SIGKILL lands at once, where a poll would let it write on for up to a second.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

import psutil

ORPHAN_EXIT = 70  # EX_SOFTWARE: not a failure of the job's own making
CHECK_SECONDS = 1.0


def end_with_parent(interval: float = CHECK_SECONDS, launcher: int | None = None) -> threading.Thread:
    """Watch the current parent from a daemon thread; the thread. `launcher`: the launcher this process ends
    with, as its environment names it (shoal.cluster.environments: `launcher_pid`); one that is already gone
    stops this process at once."""
    parent = os.getppid()
    if launcher is not None and launcher != parent and not psutil.pid_exists(launcher):
        _stop(launcher)  # orphaned before it started

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        _stop(parent)

    thread = threading.Thread(target=watch, name="shoal-orphan-watch", daemon=True)
    thread.start()
    return thread


PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent ends; `parent`, the pid the parent had when it
    started this process, tells a parent already gone (then this process stops at once). Where there is no
    prctl (not Linux), a daemon thread polls instead."""
    if not sys.platform.startswith("linux") or _prctl_death_signal(signal.SIGKILL) != 0:
        end_with_parent()
    if os.getppid() != parent:  # died before the signal was asked for: it will never come
        os._exit(ORPHAN_EXIT)


def _prctl_death_signal(number: int) -> int:
    try:
        library = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return library.prctl(PR_SET_PDEATHSIG, int(number), 0, 0, 0)
    except (OSError, AttributeError):
        return -1


def _stop(launcher: int) -> None:
    print(f"shoal worker {os.getpid()}: its launcher (pid {launcher}) is gone; stopping", file=sys.stderr,
          flush=True)
    os._exit(ORPHAN_EXIT)  # no teardown: nothing half-done may be written on the way out
