"""Machines wait to join a running job: every worker stops at the same epoch's end, with a checkpoint.

In a job whose machines may change (`--nnodes MIN:MAX`), the first machine's launcher sets `shoal/regroup`
in the attempt's store when a machine asks to join (shoal.cluster.node.watch). Rank 0 reads it at each
epoch's end and the ranks agree (one flag all-gathered, as for SLURM's warning in shoal.cluster.requeue),
so all write that epoch's checkpoint and stop there; rank 0 leaves `shoal/regrouped` for the launcher,
which then starts the next attempt with the new machine, resuming on the new world size. Nothing is lost
but the time to meet again: the epoch that ended is in the checkpoint.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from shoal.cluster import keys
from shoal.cluster.store import STORE_ERRORS, StoreUnreachable, client, worker_sealed
from shoal.errors import first_line

ELASTIC_VARIABLE = "SHOAL_ELASTIC"
"""Set by shoal's launcher in the workers' environment when machines may join the job."""


class Regroup:
    """The runner's epoch-end stop (as shoal.cluster.requeue.EpochEndStop) for machines waiting to join."""

    def __init__(self, store: dist.Store):
        self.store = store

    def agreed(self, comm) -> bool:
        """Whether machines wait to join (rank 0 asks the store): all stop at this epoch's end, or none. A store
        that is gone (the first machine's launcher killed) is one line, not torch's network traceback."""
        try:
            asked = comm.rank == 0 and self.store.check([keys.REGROUP])
        except STORE_ERRORS as error:
            raise StoreUnreachable(f"the job's store on the first machine stopped answering ({first_line(error)}): "
                                   "its launcher is gone") from None
        flags = comm.all_gather(torch.tensor([1.0 if asked else 0.0], dtype=torch.float64))
        return bool(flags.max() > 0)

    def stopped(self, rank: int, epochs_done: int) -> None:
        """Every rank stopped with its checkpoint: rank 0 tells the launcher this was no failure."""
        if rank == 0:
            self.store.set(keys.REGROUPED, str(epochs_done))


def regroup_stop(environ=os.environ) -> Regroup | None:
    """The stop for this worker when its launcher runs a job of changing machines, else None. It reads the
    attempt's store over a connection of its own: a lone worker's liveness needs none, but it must hear."""
    if not environ.get(ELASTIC_VARIABLE):
        return None
    store = client(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]))
    return Regroup(worker_sealed(store, environ))
