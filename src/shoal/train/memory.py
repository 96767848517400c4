"""A worker's resident memory, for the events: before its data is loaded and at its peak.

The difference bounds what the share, the batches and training added, which is what a
memory budget (`data.memory_per_worker`) is meant to limit.
"""

from __future__ import annotations

import os
import resource
import sys


def current_rss() -> int:
    """Resident bytes now (Linux: /proc/self/statm; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss()


def peak_rss() -> int:
    """Highest resident bytes of this process so far."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB
