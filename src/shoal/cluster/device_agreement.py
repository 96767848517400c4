"""The ranks of a job agree on their devices before they join its process group.

Each rank picks a device from what its own machine shows (`choose_device`), but the choice is the
job's: NCCL takes one GPU per rank, and every rank must use the same backend. Two nodes of one job
on one machine each see its one GPU as theirs, and a machine without GPUs beside machines with them
would join gloo where the others join NCCL; both fail inside torch.distributed, the first with NCCL's
"invalid usage", the second by hanging. So each rank posts the GPU it would take (by its UUID, which
names one GPU whatever a process's CUDA_VISIBLE_DEVICES numbers it) in the job's store, reads every
rank's, and then: "auto" stays on the GPUs when every rank has one of its own, else the whole job uses
the CPU (rank 0 says why); "cuda" is refused in one line.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from shoal.cluster import keys
from shoal.errors import ShoalError

CPU = "cpu"


def gpu_identity(device: torch.device) -> str:
    """The GPU's UUID, "cpu" for the CPU: the same string on every process that uses that GPU."""
    if device.type != "cuda":
        return CPU
    return str(torch.cuda.get_device_properties(device).uuid)


def agree_device(requested: str, proposed: torch.device, store: dist.Store, rank: int, world_size: int,
                 host: str) -> torch.device:
    """The device this rank uses: `proposed` where the job's ranks can all keep theirs, else the CPU
    (`requested` "auto"). Collective: every rank of the job calls it, with the same `requested`."""
    store.set(keys.device(rank), json.dumps({"host": host, "gpu": gpu_identity(proposed)}))
    claimed = [keys.device(other) for other in range(world_size)]
    store.wait(claimed)
    claims = [json.loads(claim) for claim in store.multi_get(claimed)]  # one request, not one per rank
    store.set(keys.device_read(rank), "1")
    if rank == 0:  # rank 0 may serve the store: it stays until every rank has read, even to fail
        store.wait([keys.device_read(other) for other in range(world_size)])
    if settle(requested, claims) == "own":
        return proposed
    if rank == 0 and any(claim["gpu"] != CPU for claim in claims):  # GPUs were there: say once why not
        print(f"shoal: cluster.device 'auto': the job trains on the CPU: {gpus_unusable(claims)}", file=sys.stderr,
              flush=True)
    return torch.device(CPU)


def settle(requested: str, claims: list[dict]) -> str:
    """"cpu" or "own" (each rank keeps the device it proposed), from every rank's claim ({"host", "gpu"}, in
    rank order). Under "cuda", ranks that cannot each have a GPU of their own are a one-line error."""
    reason = gpus_unusable(claims)
    if reason is None:
        return "own"
    if requested == "auto":
        return CPU
    raise ShoalError(f"cluster.device: 'cuda' but {reason}")


def gpus_unusable(claims: list[dict]) -> str | None:
    """Why the ranks cannot each use the GPU they claim (None: they can)."""
    for rank, claim in enumerate(claims):
        if claim["gpu"] == CPU:  # NCCL on the others, gloo here: the job would hang
            return f"rank {rank} on {claim['host']} has no GPU"
    first = {}
    for rank, claim in enumerate(claims):
        if claim["gpu"] in first:
            return (f"ranks {first[claim['gpu']]} and {rank} on {claim['host']} share one GPU (NCCL takes one GPU per "
                    f"rank): run one node per machine, show each node its own GPUs (CUDA_VISIBLE_DEVICES), or set "
                    f"cluster.device = 'cpu'")
        first[claim["gpu"]] = rank
    return None
