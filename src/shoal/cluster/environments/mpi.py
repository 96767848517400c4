"""MPI launchers: Open MPI's mpirun, MPICH's and Intel MPI's mpiexec (Hydra, PMI), MVAPICH's mpirun_rsh.

Each numbers its processes in variables of its own. None says where rank 0 runs, so MASTER_ADDR
and MASTER_PORT come from the user, or, with mpi4py installed (`pip install shoal[mpi]`), from
rank 0 over MPI itself (`agree_master`).
"""

from __future__ import annotations

import socket

import psutil

from shoal.cluster.environments.base import Environment
from shoal.cluster.interface import local_addresses, route_source
from shoal.errors import ShoalError


class OpenMPI(Environment):
    name = "Open MPI"
    RANK, SIZE = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
    LOCAL_RANK, LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"

    def stop_grace(self) -> float:
        """mpirun kills the other processes one second after its SIGTERM (odls_base_sigkill_timeout)."""
        return float(self.number("OMPI_MCA_odls_base_sigkill_timeout", 1))


class MPICH(Environment):
    """MPICH and Intel MPI through Hydra (PMI); Hydra also sets the local numbering."""

    name = "MPICH"
    RANK, SIZE, LOCAL_RANK, LOCAL_SIZE = "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"

    def stop_grace(self) -> float:
        return 1.0  # Hydra gives no documented grace: assume Open MPI's


class MVAPICH(Environment):
    name = "MVAPICH"
    RANK, SIZE = "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"
    LOCAL_RANK, LOCAL_SIZE = "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"


MPI_LAUNCHERS = (OpenMPI.name, MPICH.name, MVAPICH.name)


def agree_master(world_size: int, one_machine: bool) -> tuple[str, int] | None:
    """Rank 0's address and a free port, told to every process over MPI itself (mpi4py, the `mpi` extra);
    None without mpi4py. MPI is initialized for these two exchanges and finalized at once."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError):  # not installed, or no MPI library it can load
        return None
    world = MPI.COMM_WORLD
    try:
        if world.Get_size() != world_size:  # mpi4py loaded another implementation's library: a lone singleton
            raise ShoalError(f"mpi4py runs on {MPI.Get_library_version().split(',')[0]}, not on this job's launcher's "
                             "MPI: set MPI4PY_LIBMPI to the launcher's library, or export MASTER_ADDR and MASTER_PORT")
        rank = world.Get_rank()
        addresses, port = world.bcast((_own_addresses(), _free_port()) if rank == 0 else None, root=0)
        # each other rank picks an address of rank 0 it reaches; rank 0 takes the one most of them picked
        picks = world.allgather(None if rank == 0 or one_machine else _reachable(addresses))
    finally:
        MPI.Finalize()
    if one_machine:
        return "127.0.0.1", port
    chosen = picks[rank] if rank else max(set(picks[1:]), key=picks[1:].count)
    if chosen is None:
        raise ShoalError(f"rank 0's addresses ({', '.join(addresses) or 'none'}) cannot be reached from "
                         f"{'rank ' + str(picks.index(None, 1)) if rank == 0 else 'here'}: export MASTER_ADDR and "
                         "MASTER_PORT")
    return chosen, port


def _reachable(addresses: list[str]) -> str | None:
    """The first of rank 0's addresses this machine reaches and does not hold itself (a docker0 bridge's
    172.17.0.1 is on every machine, and would lead each to itself)."""
    own = local_addresses()
    return next((address for address in addresses if address not in own and route_source(address) is not None),
                None)


def _own_addresses() -> list[str]:
    """This machine's IPv4 addresses on interfaces that are up, loopback left out."""
    up = {name for name, stats in psutil.net_if_stats().items() if stats.isup}
    return [entry.address for name, entries in psutil.net_if_addrs().items() if name in up
            for entry in entries if entry.family == socket.AF_INET and not entry.address.startswith("127.")]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]
