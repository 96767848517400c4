"""shoal's own launcher (`shoal train`, `shoal.fit`): torch's elastic agent numbers the workers as torchrun's
does (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE: each machine's ranks contiguous, in node order, and its
own count, which may differ between machines), and the launcher names itself in SHOAL_LAUNCHER_PID so that
its workers tell it from torchrun.

A process is under shoal's launcher when that variable names its parent (a worker forked by the fork
server has the server for its parent, and the server's pid in the variable: shoal.cluster.node.forkserver),
or names a launcher already gone (a worker started after its launcher died, which must stop at once). A
variable inherited from elsewhere names a live process that is not the parent: that is not shoal's
launcher. Where shoal's launcher differs from torchrun, srun and mpirun is said by its capabilities: it
records failures, holds a store per attempt and the run directory's lock, checks the model's memory
before its workers start, and its workers end once it is gone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import psutil

from shoal.cluster.environments.base import Place
from shoal.cluster.environments.torchelastic import TorchElastic

LAUNCHER_VARIABLE = "SHOAL_LAUNCHER_PID"
"""Set by shoal's launcher for its workers: a worker started after its launcher died knows at once."""


def _named(environ: Mapping[str, str]) -> int | None:
    value = environ.get(LAUNCHER_VARIABLE, "")
    return int(value) if value.isdigit() else None


class ShoalLauncher(TorchElastic):
    name = "shoal"
    records_failures = checks_memory = holds_run_dir = True
    keeps_store_across_restarts = False  # a fresh store for each attempt (shoal.cluster.node.rendezvous)

    @staticmethod
    def variables(launcher: int) -> dict[str, str]:
        """What shoal's launcher (or the fork server, for the workers it forks) puts in its workers' environment."""
        return {LAUNCHER_VARIABLE: str(launcher)}

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        launcher = _named(environ)
        return launcher is not None and (launcher == os.getppid() or not psutil.pid_exists(launcher))

    def place(self) -> Place:
        """As torchrun's; rank 0 of 1 for a process of the launcher's that torch's agent did not number."""
        return super().place() if TorchElastic.detect(self.environ) else Place(0, 1, 0, 1)

    def launcher_pid(self) -> int:
        return int(self.environ[LAUNCHER_VARIABLE])

    def worker_ends_with_server(self) -> bool:
        """Yes while the launcher lives; once it is gone, a worker forked now keeps its pid and stops at once."""
        return self.launcher_pid() == os.getppid()
