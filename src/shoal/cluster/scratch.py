"""shoal's folders in the system's temporary folder, named by their owner and swept once it is gone.

Each attempt's launch keeps torch's worker logs in a folder of its own, `shoal train`'s fork server
its socket, and `shoal.fit` and `shoal.predict` the rows they were given in memory; all are removed on
the way out, which a SIGKILL skips. So each name carries the pid of the process that made it
(`shoal-launch-<pid>-<random>`): the fork server, which outlives a killed launcher for a moment, and
every later launch, fit or predict remove those whose maker has ended.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import psutil

LOGS = "shoal-launch-"
SERVER = "shoal-forkserver-"
DATA = "shoal-data-"  # shoal.fit's arrays, DataFrames and Datasets, written as datasets for its workers
PREDICT = "shoal-predict-"  # rows given to shoal.predict in memory
# mkdtemp's random part: lowercase, digits, _
_OWNED = re.compile(rf"^(?:{LOGS}|{SERVER}|{DATA}|{PREDICT})(\d+)-[a-z0-9_]+$")


def make(prefix: str, sweep_first: bool = False) -> str:
    """A new folder (mode 0700, a name no one can foresee) owned by this process; with `sweep_first`, the
    folders of processes that have ended go first."""
    if sweep_first:
        sweep()
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


def owner(name: str) -> int | None:
    """The pid of the launcher that made the folder `name`; None when it is not one of these."""
    matched = _OWNED.match(name)
    return int(matched.group(1)) if matched else None


def sweep(folder: str | None = None) -> list[str]:
    """Remove the launchers' folders in `folder` (the temporary folder) whose launcher has ended."""
    folder = folder or tempfile.gettempdir()
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        pid = owner(name)
        path = os.path.join(folder, name)
        if pid is None or pid == os.getpid() or _alive(pid) or os.path.islink(path):
            continue
        shutil.rmtree(path, ignore_errors=True)  # never follows a link inside
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    """Whether `pid` runs (another user's process counts); a killed launcher its parent has not yet
    reaped is gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to look at: alive
        return True
