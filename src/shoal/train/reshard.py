"""Resuming a checkpoint on another number of workers ("resharding"): rank 0's state for every rank.

Machines leave and join a running job, which then starts again with `--resume` on the workers it
has. When the newest checkpoint rank 0 holds was written by as many workers as the job has now,
the resume is exact and each rank loads its own file (`checkpoint.agree_on_latest`). Otherwise
the checkpoint is resharded, by these rules:

- Only rank 0's files are read (the coordinator file and rank 0's): rank 0 always runs on the
  first machine, which keeps them, while another machine may hold nothing (no shared folder, or a
  machine new to the job). Rank 0 loads its file and broadcasts it, and every rank takes it as its
  own (`TrainingState.load_resharded`, then the algorithm's `reshard_`). Rank 0's file is checked
  first as an exact resume's are (its digest, then `TrainingState.fits`): a damaged one is passed
  over, with a warning naming it, for the epoch before, so no rank applies any of it.
- Collective algorithms (none, sync, averaging, synchronous EASGD): every rank takes rank 0's
  model, optimizer moments, schedule and algorithm state. Synchronous SGD's replicas are the same
  anyway; averaging's are equal after every epoch's closing round; synchronous EASGD's centre and
  its velocity are shared, and each worker's replica starts again at the centre.
- Parameter-server algorithms (Downpour, asynchronous EASGD): the new rank 0 serves on with the
  server's model, optimizer, version and velocity; every trainer (and sub-master) takes the
  server's model and version, so staleness counts on from there, and a fresh optimizer.
- The clocks go on: the global step is rank 0's, schedules continue where they were, as do
  averaging's `averaged_at`, EASGD's `pulled_at` and `crossed_at`, the server's version, the stop
  rule's counts and the latest test metrics. An epoch has the steps of the new world size.
- Random generators: each rank seeds torch, numpy and Python from (train.seed, the checkpoint's
  epoch, the new world size, its rank), so the same changes of size give the same weights. The
  data order is a function of seed, epoch and rank, as always.
- Shares sized by speed (cluster.balance = "speed") are dropped: the next epoch is planned as a
  fresh job's (equal shares), then measured again. A fixed list of speeds must have one per
  training worker of the new count (refused before any worker starts otherwise).
- The coordinator's `job_resumed` event records the size that wrote the checkpoint
  (`resharded_from`) beside the new one (`world_size`).

A resharded job does not end with the weights of an uninterrupted one: from the resume on, each
epoch is trained by the new number of workers on their shares.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from shoal.cluster.collectives import Communicator
from shoal.train.checkpoint import Fits, Found, load_rank
from shoal.train.state import TrainingState


def reshard_seed(seed: int, epoch: int, world_size: int, rank: int) -> int:
    """The seed of `rank`'s random generators after resharding the checkpoint of `epoch` onto `world_size`."""
    return int(np.random.SeedSequence([seed, epoch, world_size, rank]).generate_state(1, np.uint64)[0])


def reseed(seed: int) -> None:
    """Seed every generator a model or factory may draw from (torch's, CUDA's too, numpy's, Python's)."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def rank_zero_state(found: Found, comm: Communicator, fits: Fits | None = None) -> dict:
    """Rank 0's state in checkpoint `found`, on every rank: rank 0 reads its file (checked against its digest and,
    with `fits`, its content, before it goes anywhere) and sends it (collective)."""
    return comm.broadcast_object(load_rank(found.path, 0, fits) if comm.rank == 0 else None)


def resume_resharded(state: TrainingState, found: Found, comm: Communicator, seed: int) -> None:
    """Every rank continues from rank 0's state of checkpoint `found` (collective); `seed`: train.seed."""
    state.load_resharded(rank_zero_state(found, comm, state.fits))
    reseed(reshard_seed(seed, found.epoch, comm.world_size, comm.rank))
