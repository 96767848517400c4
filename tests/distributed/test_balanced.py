"""Shares sized to speed over a real gloo process group: the arithmetic holds between processes too.

Synchronous SGD with a same-steps plan of speeds 3:1 (batches three times as large on one worker) takes
exactly the steps of one model on the concatenated batches; asynchronous Downpour with own-steps shares
2:1 serves every update each trainer sends, the faster one sending more.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from torch.nn import functional

from shoal.algorithms import make_algorithm
from shoal.algorithms.sync import SynchronousSGD
from shoal.cluster.collectives import Communicator
from shoal.data.balance import weighted_plan
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, parameters, small_model, write_dataset
from tests.distributed.harness import run_processes
from tests.support.shares import worker_batches

BATCH, SEED, EPOCHS, ROWS = 8, 5, 2, 101


def optimizer_for(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def sync_worker(rank: int, world_size: int, path: str, plan):
    model = small_model()
    optimizer = optimizer_for(model)
    comm = Communicator(rank, world_size)
    algorithm = SynchronousSGD()
    algorithm.weigh_by_rows = True
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(open_dataset(path), rank=rank, world_size=world_size, batch_size=BATCH, seed=SEED, plan=plan)
    trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
    rows = [trainer.train_epoch(epoch).rows for epoch in range(EPOCHS)]
    return {"parameters": parameters(model), "steps": trainer.global_step, "rows": rows}


@pytest.mark.timeout(90)
def test_sync_on_shares_three_to_one_equals_one_worker_on_the_global_batch(tmp_path):
    path = write_dataset(tmp_path / "data", rows=ROWS, seed=3)
    plan = weighted_plan(ROWS, [3.0, 1.0], BATCH, same_steps=True)
    assert plan.shares == (76, 25) and plan.nominal == 7  # batches of 10-11 rows against 3-4
    results = run_processes(sync_worker, 2, path, plan, timeout=60)
    for worker, result in enumerate(results):
        assert result["steps"] == EPOCHS * plan.nominal
        assert result["rows"] == [plan.shares[worker]] * EPOCHS

    features, labels = open_dataset(path).read_all()
    model = small_model()
    optimizer = optimizer_for(model)
    for epoch in range(EPOCHS):
        for step_rows in zip(*(worker_batches(plan, worker, SEED, epoch) for worker in range(2)), strict=True):
            rows = np.concatenate(step_rows)
            optimizer.zero_grad()
            functional.cross_entropy(model(torch.from_numpy(features[rows])), torch.from_numpy(labels[rows])).backward()
            optimizer.step()
    # gloo sums the row-weighted gradients in its own order: a few ulps from the single model's mean
    for result in results:
        for got, expected in zip(result["parameters"], parameters(model), strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


OWN = weighted_plan(100, [2.0, 1.0], BATCH, same_steps=False)  # 67 and 33 rows: 9 and 5 steps
SYNC_EVERY = 2


def downpour_rank(rank: int, world_size: int, path: str):
    model = small_model()
    comm = Communicator(rank, world_size)
    algorithm = make_algorithm("downpour", {"sync_every": SYNC_EVERY})
    algorithm.weigh_by_rows = True
    algorithm.setup(model, torch.optim.SGD(model.parameters(), lr=0.05), comm)
    trainers = algorithm.trainer_ranks(world_size)
    algorithm.plan(dict(zip(trainers, OWN.steps)))
    if rank == 0:
        sources, reports = [], []
        receive = algorithm.receive_update

        def recording(copy=True):
            source, message = receive(copy)
            sources.append(source)
            return source, message

        algorithm.receive_update = recording
        for epoch in range(EPOCHS):
            algorithm.serve_epoch(epoch)
            reports.append(algorithm.epoch_report())
            comm.barrier()  # the runner's ranks meet at every epoch's end
        return {"reports": reports, "sources": sources, "version": algorithm.version}
    loader = ShardLoader(open_dataset(path), rank=trainers.index(rank), world_size=len(trainers), batch_size=BATCH,
                         seed=SEED, plan=OWN)
    trainer = Trainer(model, algorithm.optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
    rows = []
    for epoch in range(EPOCHS):
        rows.append(trainer.train_epoch(epoch).rows)
        comm.barrier()
    return {"rows": rows}


@pytest.mark.timeout(90)
def test_asynchronous_downpour_serves_each_trainers_own_count_of_updates(tmp_path):
    path = write_dataset(tmp_path / "data", rows=100, seed=6)
    server, *trainers = run_processes(downpour_rank, 3, path, timeout=60)
    sends = [math.ceil(steps / SYNC_EVERY) for steps in OWN.steps]
    assert sends == [5, 3]
    for worker, result in enumerate(trainers):
        assert result["rows"] == [OWN.shares[worker]] * EPOCHS  # each consumed its whole share
    assert Counter(server["sources"]) == {1: EPOCHS * sends[0], 2: EPOCHS * sends[1]}
    assert server["version"] == EPOCHS * sum(sends)
    assert [report["updates"] for report in server["reports"]] == [sum(sends)] * EPOCHS
