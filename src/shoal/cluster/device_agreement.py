"""The ranks of a job agree on their devices before they join its process group.

Each rank picks a device from what its own machine shows (`choose_device`), but the choice is the
job's: NCCL takes one GPU per rank, and every rank must use the same backend. Two nodes of one job
on one machine each see its one GPU as theirs, and a machine without GPUs beside machines with them
would join gloo where the others join NCCL; both fail inside torch.distributed, the first with NCCL's
"invalid usage", the second by hanging. So each rank posts the GPU it would take (by its UUID, which
names one GPU whatever a process's CUDA_VISIBLE_DEVICES numbers it) in the job's store, reads every
rank's, and then: "auto" stays on the GPUs when every rank has one of its own, else the whole job uses
the CPU; "cuda" with a GPU claimed twice is refused in one line.
"""

from __future__ import annotations

import json
from collections import defaultdict

import torch
import torch.distributed as dist

from shoal.errors import ShoalError

CPU = "cpu"
KEY = "shoal/device/{rank}"
READ = "shoal/device/read/{rank}"


def gpu_identity(device: torch.device) -> str:
    """The GPU's UUID, "cpu" for the CPU: the same string on every process that uses that GPU."""
    if device.type != "cuda":
        return CPU
    return str(torch.cuda.get_device_properties(device).uuid)


def agree_device(requested: str, proposed: torch.device, store: dist.Store, rank: int, world_size: int,
                 host: str) -> torch.device:
    """The device this rank uses: `proposed` where the job's ranks can all keep theirs, else the CPU
    (`requested` "auto"). Collective: every rank of the job calls it, with the same `requested`."""
    store.set(KEY.format(rank=rank), json.dumps({"host": host, "gpu": gpu_identity(proposed)}))
    keys = [KEY.format(rank=other) for other in range(world_size)]
    store.wait(keys)
    claims = [json.loads(claim) for claim in store.multi_get(keys)]  # one request, not one per rank
    store.set(READ.format(rank=rank), "1")
    if rank == 0:  # rank 0 may serve the store: it stays until every rank has read, even to fail
        store.wait([READ.format(rank=other) for other in range(world_size)])
    return torch.device(CPU) if settle(requested, claims) == CPU else proposed


def settle(requested: str, claims: list[dict]) -> str:
    """"cpu" or "own" (each rank keeps the device it proposed), from every rank's claim ({"host", "gpu"}, in
    rank order). Under "cuda", a rank without a GPU or a GPU claimed twice is a one-line error."""
    holders = defaultdict(list)
    for rank, claim in enumerate(claims):
        if claim["gpu"] != CPU:
            holders[claim["gpu"]].append(rank)
    shared = [ranks for ranks in holders.values() if len(ranks) > 1]
    if requested == "auto":
        return CPU if shared or any(claim["gpu"] == CPU for claim in claims) else "own"
    without = [rank for rank, claim in enumerate(claims) if claim["gpu"] == CPU]
    if without:  # NCCL on the others, gloo on these: the job would hang
        raise ShoalError(f"cluster.device: 'cuda' but rank {without[0]} on {claims[without[0]]['host']} has no GPU")
    if shared:
        ranks = shared[0]
        raise ShoalError(f"cluster.device: 'cuda' gives ranks {', '.join(map(str, ranks))} one GPU on "
                         f"{claims[ranks[0]]['host']} (NCCL takes one GPU per rank): run one node per machine, "
                         f"show each node its own GPUs (CUDA_VISIBLE_DEVICES), or set cluster.device = 'cpu'")
    return "own"
