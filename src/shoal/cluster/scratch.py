"""shoal's folders in the system's temporary folder, named by their owner and swept once it is gone.

Each attempt's launch keeps torch's worker logs in a folder of its own, `shoal train`'s fork server
its socket, and `shoal.fit` and `shoal.predict` the rows they were given in memory; all are removed on
the way out, which a SIGKILL skips. So each name carries the pid of the process that made it
(`shoal-launch.<host>.<pid>.<random>.tmp`, as shoal.data.leftovers names every temporary): the fork
server, which outlives a killed launcher for a moment, and every later launch, fit or predict remove
those whose maker has ended.
"""

from __future__ import annotations

import os
import tempfile

from shoal.data import leftovers

LOGS = "shoal-launch"
SERVER = "shoal-forkserver"
DATA = "shoal-data"  # shoal.fit's arrays, DataFrames and Datasets, written as datasets for its workers
PREDICT = "shoal-predict"  # rows given to shoal.predict in memory
PREFIXES = (LOGS, SERVER, DATA, PREDICT)


def make(prefix: str, sweep_first: bool = False) -> str:
    """A new folder (mode 0700, a name no one can foresee) owned by this process; with `sweep_first`, the
    folders of processes that have ended go first."""
    if sweep_first:
        sweep()
    path = os.path.join(tempfile.gettempdir(), leftovers.owned_name(prefix))
    os.mkdir(path, 0o700)  # a new folder, never one already there nor a link's target
    return path


def owner(name: str) -> int | None:
    """The pid of the process that made the folder `name`; None when it is not one of these."""
    return leftovers.owner(name) if name.startswith(PREFIXES) else None


def sweep(folder: str | None = None, ended: tuple[int, ...] = ()) -> list[str]:
    """Remove the folders in `folder` (the temporary folder) whose maker has ended, or is known to have
    (`ended`), never a link's target."""
    folder = folder or tempfile.gettempdir()
    return [path for prefix in PREFIXES for path in leftovers.sweep(folder, f"{prefix}.", ended)]
