"""Who am I under each launcher: one module per launcher, asked in order of precedence.

A launcher's own variables come before an outer allocation's: mpirun or torchrun inside an
sbatch script sees SLURM's variables too, but its processes are numbered by mpirun or
torchrun, not by SLURM; shoal's own launcher runs torch's agent, so it comes before torchrun.
Each environment answers `detect`, `place` (rank, world size, local rank, local world size),
`master` (where rank 0's store is, when the launcher can tell), whether the launcher binds one GPU
to each process, and its capabilities (see base.Environment): who records failures, who holds the
store and the run directory, who checked memory, and which process a worker ends with.
"""

from __future__ import annotations

from collections.abc import Mapping

from shoal.cluster.environments.base import Environment, Place
from shoal.cluster.environments.mpi import MPICH, MVAPICH, OpenMPI
from shoal.cluster.environments.shoal_launcher import ShoalLauncher
from shoal.cluster.environments.slurm import Slurm
from shoal.cluster.environments.torchelastic import TorchElastic

ENVIRONMENTS: tuple[type[Environment], ...] = (ShoalLauncher, TorchElastic, OpenMPI, MPICH, MVAPICH, Slurm)
"""In order of precedence: the launcher closest to the process first, an allocation's scheduler last."""


def detect(environ: Mapping[str, str]) -> Environment | None:
    """The environment of the launcher that started this process, or None (started alone)."""
    for environment in ENVIRONMENTS:
        if environment.detect(environ):
            return environment(environ)
    return None


def named(name: str | None) -> type[Environment]:
    """The class of the environment `get_dist_info` detected and named (DistInfo.launcher), to ask its
    capabilities; Environment itself, which has none, for a process started alone."""
    return next((environment for environment in ENVIRONMENTS if environment.name == name), Environment)


__all__ = ["ENVIRONMENTS", "MPICH", "MVAPICH", "Environment", "OpenMPI", "Place", "ShoalLauncher", "Slurm",
           "TorchElastic", "detect", "named"]
