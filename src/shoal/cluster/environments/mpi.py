"""MPI launchers: Open MPI's mpirun, MPICH's and Intel MPI's mpiexec (Hydra, PMI), MVAPICH's mpirun_rsh.

Each numbers its processes in variables of its own. None says where rank 0 runs, so MASTER_ADDR
and MASTER_PORT come from the user (or from mpi4py, when installed: see shoal.cluster.env).
"""

from __future__ import annotations

from shoal.cluster.environments.base import Environment


class OpenMPI(Environment):
    name = "Open MPI"
    RANK, SIZE = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
    LOCAL_RANK, LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"


class MPICH(Environment):
    """MPICH and Intel MPI through Hydra (PMI); Hydra also sets the local numbering."""

    name = "MPICH"
    RANK, SIZE, LOCAL_RANK, LOCAL_SIZE = "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"


class MVAPICH(Environment):
    name = "MVAPICH"
    RANK, SIZE = "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"
    LOCAL_RANK, LOCAL_SIZE = "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"
