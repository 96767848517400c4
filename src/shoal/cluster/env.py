"""Who am I: rank, world size and local rank from torchrun, SLURM or Open MPI variables.

This is the one place that reads the launcher's environment, so every other module takes a
`DistInfo` and can be driven by tests without environment variables.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from shoal.cluster.interface import choose_interface
from shoal.errors import ShoalError

# (rank, world size, local rank, local world size) variable names, by launcher.
_LAUNCHERS = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
)


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    host: str = socket.gethostname()


def get_dist_info() -> DistInfo:
    """Read the launcher's variables; a process started alone is rank 0 of 1."""
    for rank, size, local, local_size in _LAUNCHERS:
        if rank in os.environ and size in os.environ:
            world_size = int(os.environ[size])
            local_world = os.environ.get(local_size, str(world_size)).split("(")[0]
            return DistInfo(
                rank=int(os.environ[rank]),
                world_size=world_size,
                local_rank=int(os.environ.get(local, "0")),
                local_world_size=int(local_world),
            )
    return DistInfo()


def init_process_group(info: DistInfo, device: torch.device, timeout: float) -> None:
    """Join the job's process group: NCCL on CUDA, gloo on CPU, rendezvous through MASTER_ADDR/PORT."""
    if info.world_size == 1 or dist.is_initialized():
        return
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        raise ShoalError("MASTER_ADDR and MASTER_PORT must be set for a job started by SLURM or mpirun")
    choose_interface()  # the interface that reaches the other machines, not the hostname's loopback
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timedelta(seconds=timeout),
        device_id=device if device.type == "cuda" else None,
    )


def choose_device(name: str, info: DistInfo) -> torch.device:
    """The device for this rank: local rank n uses cuda:n when CUDA is asked for, or present for all."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # NCCL refuses two ranks on one GPU: "auto" uses the CPU unless every local worker gets its own
    if name == "cuda" or (name == "auto" and 0 < info.local_world_size <= gpus):
        if gpus == 0:
            raise ShoalError("cluster.device: 'cuda' asked for but no CUDA device is available")
        if info.local_world_size > gpus:
            raise ShoalError(f"cluster.device: 'cuda' with {info.local_world_size} workers on a machine with "
                             f"{gpus} GPU(s): use at most one worker per GPU")
        index = info.local_rank
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def cores() -> int:
    """Cores this process may use (the affinity mask, not the whole machine)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def threads_per_worker(configured: int, local_workers: int) -> int:
    """The configured thread count, or this machine's cores shared evenly: workers x threads = cores."""
    return configured or max(1, cores() // local_workers)


def print0(*args, info: DistInfo | None = None, **kwargs) -> None:
    """Print on rank 0 only."""
    if (info or get_dist_info()).rank == 0:
        print(*args, **kwargs)
