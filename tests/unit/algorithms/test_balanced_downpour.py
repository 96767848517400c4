"""Asynchronous parameter servers on shares sized to speed: a trainer given more rows sends more updates.

With own-steps shares 2:1 each trainer takes batches of the job's batch size over its whole share, so
the faster one runs twice the steps and sends twice the updates; the server, told each trainer's steps,
serves sum(ceil(steps / every)) updates an epoch and counts the staleness of every one. Ranks are
threads of the fake communicator: no processes.
"""

from __future__ import annotations

import math
import threading
from collections import Counter

import pytest
import torch

from shoal.algorithms import Role, make_algorithm, role
from shoal.cluster.fake import run_ranks
from shoal.data.balance import weighted_plan
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, small_model, write_dataset

BATCH, SEED, EPOCHS, ROWS = 8, 3, 2, 100
PLAN = weighted_plan(ROWS, [2.0, 1.0], BATCH, same_steps=False)  # 67 and 33 rows: 9 and 5 steps
SEEDING = threading.Lock()  # ranks are threads: model construction seeds the global generator


def drive(comm, path: str, name: str, options: dict):
    """One rank as the runner drives it on the plan: the server serves, the two trainers train their shares."""
    with SEEDING:
        model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    algorithm = make_algorithm(name, options)
    algorithm.weigh_by_rows = True
    algorithm.check(comm.world_size)
    assert not algorithm.same_steps()  # asynchronous: each trainer runs its own steps
    versions: list[int] = []
    algorithm.setup(model, optimizer, comm, on_update=versions.append)
    trainers = algorithm.trainer_ranks(comm.world_size)
    algorithm.plan(dict(zip(trainers, PLAN.steps)))  # as the runner's trainer_steps()
    if role(algorithm, comm.rank, comm.world_size) is Role.SERVER:
        sources: list[int] = []
        receive = algorithm.receive_update

        def recording(copy=True):
            source, message = receive(copy)
            sources.append(source)
            return source, message

        algorithm.receive_update = recording
        reports, served = [], []
        for epoch in range(EPOCHS):
            algorithm.serve_epoch(epoch)
            reports.append(algorithm.epoch_report())
            served.append(Counter(sources))
            sources.clear()
            comm.barrier()  # every rank meets at an epoch's end, as the runner's gathered statistics make them
        return {"reports": reports, "versions": versions, "expected": algorithm.updates_per_epoch(), "served": served}
    loader = ShardLoader(open_dataset(path), rank=trainers.index(comm.rank), world_size=len(trainers),
                         batch_size=BATCH, seed=SEED, plan=PLAN)
    trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
    sent = []
    exchange = algorithm.exchange_

    def counting() -> None:
        sent.append(trainer.global_step)
        exchange()

    algorithm.exchange_ = counting
    epochs = []
    for epoch in range(EPOCHS):
        epochs.append(trainer.train_epoch(epoch))
        comm.barrier()
    return {"rows": [stats.rows for stats in epochs], "steps": [stats.steps for stats in epochs], "sent": sent}


@pytest.mark.parametrize(("name", "options", "every"), [
    ("downpour", {"sync_every": 1}, [1, 1]),
    ("downpour", {"sync_every": 2}, [2, 2]),
    ("downpour", {"sync_every": 4}, [4, 4]),
    ("easgd", {"synchronous": False, "period": 3}, [3, 3]),
    ("easgd", {"synchronous": False, "period": "epoch"}, list(PLAN.steps)),  # once, at each trainer's epoch end
])
def test_each_trainer_sends_its_own_count_and_the_server_counts_every_update(tmp_path, name, options, every):
    assert PLAN.shares == (67, 33) and PLAN.steps == (9, 5)
    path = write_dataset(tmp_path / "data", rows=ROWS, seed=6)
    server, *trainers = run_ranks(3, lambda comm: drive(comm, path, name, options), timeout=20)
    sends = [math.ceil(steps / gap) for steps, gap in zip(PLAN.steps, every, strict=True)]
    for worker, result in enumerate(trainers):
        assert result["rows"] == [float(PLAN.shares[worker])] * EPOCHS  # the whole share, every epoch
        assert result["steps"] == [float(PLAN.steps[worker])] * EPOCHS
        assert len(result["sent"]) == EPOCHS * sends[worker]
    assert server["expected"] == sum(sends)
    assert server["versions"] == list(range(1, EPOCHS * sum(sends) + 1))  # every update applied, in order
    for epoch, report in enumerate(server["reports"]):
        assert server["served"][epoch] == {1: sends[0], 2: sends[1]}  # the faster trainer sent more
        assert report["updates"] == sum(sends)  # the staleness of each update counted, none missed or twice
        assert report["version"] == (epoch + 1) * sum(sends)
        staleness = report["staleness"]
        assert 0 <= staleness["mean"] <= staleness["max"] < report["version"]  # measured against versions served
