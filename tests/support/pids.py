"""Process ids for tests: one that no process has (without starting one to get it) and whether one has ended."""

from __future__ import annotations

from pathlib import Path

import psutil

PID_MAX = Path("/proc/sys/kernel/pid_max")
PID_MAX_LIMIT = 2 ** 22  # the kernel's ceiling for pid_max on 64-bit machines


def unused_pid() -> int:
    """A pid no process has or will have: the kernel gives out pids below pid_max only (proc(5))."""
    try:
        return int(PID_MAX.read_text())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def ended(pid: int, timeout: float) -> bool:
    """Whether `pid` ended within `timeout` seconds (a zombie awaiting its new parent counts)."""
    try:
        process = psutil.Process(pid)
        process.wait(timeout=timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return process.status() == psutil.STATUS_ZOMBIE
    return True
