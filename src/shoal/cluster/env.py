"""Who am I: rank, world size and local rank from whichever launcher started this process.

This is the one place that asks the launcher's environment (shoal.cluster.environments: torchrun,
Open MPI, MPICH, MVAPICH, SLURM), so every other module takes a `DistInfo` and can be driven by
tests without environment variables.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from shoal.cluster import keys
from shoal.cluster.collectives import open_message_group
from shoal.cluster.device_agreement import agree_device
from shoal.cluster.environments import detect, named
from shoal.cluster.environments.mpi import MPI_LAUNCHERS, agree_master
from shoal.cluster.interface import choose_interface
from shoal.cluster.store import attempt_store, client, group_store, worker_context, worker_secret
from shoal.errors import ShoalError


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    host: str = socket.gethostname()
    launcher: str | None = None
    """The launcher that numbered it (torchrun, Open MPI, MPICH, MVAPICH, SLURM), None alone."""
    master: tuple[str, int] | None = None
    """Where rank 0's store is (MASTER_ADDR and MASTER_PORT, or what the launcher implies)."""
    gpu_per_process: bool = False
    """The launcher shows each process its own GPU only (SLURM's --gpus-per-task=1)."""
    restarts: int = 0
    """How many times the launcher restarted the job's workers before this attempt (torchrun's agents do)."""
    max_restarts: int = 0
    """How many times it restarts them at most (torchrun's --max-restarts)."""
    requeued: int = 0
    """How many times the scheduler requeued the job (SLURM_RESTART_COUNT)."""
    stop_grace: float = 30.0
    """Seconds the launcher waits between its SIGTERM and its SIGKILL."""
    device: str | None = None
    """The device the job's ranks agreed on for this one when they joined (`init_process_group`)."""


def get_dist_info(environ: Mapping[str, str] = os.environ) -> DistInfo:
    """Ask the launcher's environment; a process started alone is rank 0 of 1."""
    environment = detect(environ)
    if environment is None:
        return DistInfo()
    place = environment.place()
    return DistInfo(rank=place.rank, world_size=place.world_size, local_rank=place.local_rank,
                    local_world_size=place.local_world_size, launcher=environment.name,
                    master=environment.master(), gpu_per_process=environment.gpu_per_process(),
                    max_restarts=environment.max_restarts(), requeued=environment.requeue_count(),
                    stop_grace=environment.stop_grace())


def init_process_group(info: DistInfo, device: torch.device, timeout: float, requested: str | None = None) -> DistInfo:
    """Join the job's process group: NCCL on CUDA, gloo on CPU, rendezvous at rank 0's store (and, under
    NCCL, a gloo group beside it for the parameter servers' messages: `open_message_group`). `device` is
    this rank's choice (`choose_device`) of `requested` (cluster.device; None: `device` and no other):
    under "auto" or on a GPU the ranks first agree on their devices (`agree_device`).
    Returns `info` with the attempt (`restarts`) and the device every rank agreed on."""
    if info.world_size == 1 or dist.is_initialized():  # alone: torchrun's own count is the job's
        return dataclasses.replace(info, restarts=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
    one_machine = info.world_size == info.local_world_size  # machines may run different counts: true on one alone
    master = info.master
    if master is None and info.launcher in MPI_LAUNCHERS:
        master = agree_master(info.world_size, one_machine)
    if master is None:
        hint = " (or install mpi4py: pip install shoal[mpi])" if info.launcher in MPI_LAUNCHERS else ""
        raise ShoalError(f"MASTER_ADDR and MASTER_PORT must be set for a job started by {info.launcher or 'hand'} "
                         f"(the address and a free port of the machine that runs rank 0){hint}")
    # torch's env:// and the heartbeats' store connection read them (a SLURM or MPI job's are derived)
    os.environ.setdefault("MASTER_ADDR", master[0])
    os.environ.setdefault("MASTER_PORT", str(master[1]))
    # the interface that reaches the other machines, not the hostname's loopback
    choose_interface(one_machine=one_machine)
    attempt, store = agree_attempt(info, master, timeout)
    if worker_secret() and not store:  # shoal's launcher: the group's keys too under the job's secret
        store = {"store": dist.PrefixStore("default_pg", rendezvous_store(info, timeout))}
    if requested == "auto" or device.type == "cuda":
        agreed_in = store.get("store") or rendezvous_store(info, timeout)
        device = agree_device(requested or "cuda", device, agreed_in, info.rank, info.world_size, info.host)
        store = store or {"store": dist.PrefixStore("default_pg", agreed_in)}  # as torch's env:// join keys it
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timedelta(seconds=timeout),
        device_id=device if device.type == "cuda" else None,
        **store,
    )
    open_message_group(timedelta(seconds=timeout))  # NCCL's job: the servers' messages over gloo
    return dataclasses.replace(info, restarts=attempt, device=str(device))


def rendezvous_store(info: DistInfo, timeout: float) -> dist.Store:
    """The job's store at MASTER_ADDR:MASTER_PORT, served by rank 0, as `init_process_group` opens it."""
    store, _, _ = next(dist.rendezvous("env://", info.rank, info.world_size, timeout=timedelta(seconds=timeout)))
    store.set_timeout(timedelta(seconds=timeout))
    secret = worker_secret()
    return group_store(store, secret, worker_context()) if secret else store


def agree_attempt(info: DistInfo, master: tuple[str, int], timeout: float) -> tuple[int, dict]:
    """Under torchrun: which attempt of the job this is, and a fresh key space in its store for it.

    torchrun's agents keep their store across restarts, and the last attempt's keys would send
    gloo to workers that are gone. Nor do they agree on a count: a machine restarted because
    another machine's worker failed does not count it. Every rank starts once per attempt, so
    each counts its own starts in the store, and all arrive at the same number. (Where the
    workers do not share the agents' store, rank 0 hosts a fresh one and the agent's count is
    all there is.)"""
    if not named(info.launcher).keeps_store_across_restarts:  # shoal's own: a store per attempt; SLURM, MPI: none
        return 0, {}
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return restarts, {}
    agents = client(master[0], master[1], timeout)
    # one machine has one agent, whose count is the job's; across machines the ranks count their starts
    attempt = restarts if info.world_size == info.local_world_size else agents.add(keys.started(info.rank), 1) - 1
    return attempt, ({"store": attempt_store(agents, attempt)} if attempt else {})


def choose_device(name: str, info: DistInfo) -> torch.device:
    """The device for this rank: local rank n uses cuda:n when CUDA is asked for, or present for all; once
    joined, the device the job's ranks agreed on."""
    if info.device is not None:
        device = torch.device(info.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return device
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if info.gpu_per_process and gpus == 1 and name in ("auto", "cuda"):  # bound by the launcher: its own GPU
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
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
