"""Synchronous SGD on shares sized to speed: uneven batches still give one worker's step on the global batch.

With a same-steps plan every worker runs the nominal steps and a worker given three times the rows takes
batches three times as large. Each gradient is weighted by its batch's rows before the sum, so every
step is exactly the step of one model on the concatenation of the workers' batches. Ranks are threads
of the fake communicator: no processes.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch.nn import functional

from shoal.algorithms.sync import SynchronousSGD
from shoal.cluster.fake import run_ranks
from shoal.data.balance import weighted_plan
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, parameters, small_model, write_dataset
from tests.support.shares import worker_batches

BATCH, SEED, EPOCHS, ROWS = 8, 5, 2, 101
SEEDING = threading.Lock()  # ranks are threads: model construction seeds the global generator


def optimizer_for(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def sync_rank(comm, path: str, plan):
    with SEEDING:
        model = small_model()
    optimizer = optimizer_for(model)
    algorithm = SynchronousSGD()
    algorithm.weigh_by_rows = True  # as the runner sets it for any balance but "equal"
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(open_dataset(path), rank=comm.rank, world_size=comm.world_size, batch_size=BATCH,
                         seed=SEED, plan=plan)
    trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
    rows = [trainer.train_epoch(epoch).rows for epoch in range(EPOCHS)]
    return {"parameters": parameters(model), "steps": trainer.global_step, "rows": rows}


@pytest.mark.parametrize("speeds", [[3.0, 1.0], [1.0, 2.0, 5.0]])
def test_workers_with_uneven_batches_equal_one_worker_on_the_global_batch(tmp_path, speeds):
    path = write_dataset(tmp_path / "data", rows=ROWS, seed=3)
    plan = weighted_plan(ROWS, speeds, BATCH, same_steps=True)
    sizes = [{hi - lo for lo, hi in plan.bounds(worker)} for worker in range(len(speeds))]
    assert len({max(size) for size in sizes}) == len(speeds)  # the workers take batches of different sizes
    results = run_ranks(len(speeds), lambda comm: sync_rank(comm, path, plan), timeout=20)
    for worker, result in enumerate(results):
        assert result["steps"] == EPOCHS * plan.nominal
        assert result["rows"] == [plan.shares[worker]] * EPOCHS

    features, labels = open_dataset(path).read_all()
    model = small_model()
    optimizer = optimizer_for(model)
    for epoch in range(EPOCHS):
        per_worker = [worker_batches(plan, worker, SEED, epoch) for worker in range(len(speeds))]
        for step_rows in zip(*per_worker, strict=True):
            rows = np.concatenate(step_rows)  # the global batch: every worker's batch of this step
            optimizer.zero_grad()
            functional.cross_entropy(model(torch.from_numpy(features[rows])), torch.from_numpy(labels[rows])).backward()
            optimizer.step()
    # float sums in another order (a mean per worker, weighted, summed across ranks): a few ulps apart
    for result in results:
        for got, expected in zip(result["parameters"], parameters(model), strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
