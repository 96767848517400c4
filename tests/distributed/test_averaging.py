"""Parallel SGD: after every round all replicas equal the mean of independently trained ones."""

from __future__ import annotations

import torch
from torch.nn import functional

from shoal.algorithms.averaging import AveragingOptions, ModelAveraging
from shoal.algorithms.base import model_state
from shoal.cluster.collectives import Communicator
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, rank_batches, small_model, write_dataset
from tests.distributed.harness import run_processes

BATCH, SEED, PERIOD, EPOCHS = 8, 11, 4, 2


def optimizer_for(model):
    return torch.optim.Adam(model.parameters(), lr=0.01)


class RecordingAveraging(ModelAveraging):
    """Keeps each replica's weights just before and just after every averaging round."""

    def setup(self, model, optimizer, comm) -> None:
        super().setup(model, optimizer, comm)
        self.rounds = []

    def average_(self) -> None:
        before = [t.clone() for t in model_state(self.model)]
        super().average_()
        self.rounds.append({"step": self.step_count, "before": before,
                            "after": [t.clone() for t in model_state(self.model)]})


def averaging_worker(rank: int, world_size: int, path: str, period):
    model = small_model()
    optimizer = optimizer_for(model)
    comm = Communicator(rank, world_size)
    algorithm = RecordingAveraging(AveragingOptions(period=period))
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(open_dataset(path), rank=rank, world_size=world_size, batch_size=BATCH, seed=SEED)
    trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
    for epoch in range(EPOCHS):
        trainer.train_epoch(epoch)
    return algorithm.rounds


def reference_rounds(path: str, world_size: int, period) -> list[dict]:
    """Independent replicas, each with its own optimizer, averaged by the test itself."""
    features, labels = open_dataset(path).read_all()
    replicas = [small_model() for _ in range(world_size)]
    optimizers = [optimizer_for(replica) for replica in replicas]
    rounds, step = [], 0

    def average():
        before = [[p.detach().clone() for p in replica.parameters()] for replica in replicas]
        mean = [torch.stack(group).mean(dim=0) for group in zip(*before)]
        for replica in replicas:
            with torch.no_grad():
                for parameter, value in zip(replica.parameters(), mean):
                    parameter.copy_(value)
        rounds.append({"step": step, "before": before, "after": mean})

    for epoch in range(EPOCHS):
        for step_rows in rank_batches(path, world_size, BATCH, SEED, epoch):
            step += 1
            for replica, optimizer, rows in zip(replicas, optimizers, step_rows):
                optimizer.zero_grad()
                inputs, targets = torch.from_numpy(features[rows]), torch.from_numpy(labels[rows])
                functional.cross_entropy(replica(inputs), targets).backward()
                optimizer.step()
            if period != "epoch" and step % period == 0:
                average()
        if period == "epoch" or rounds[-1]["step"] != step:
            average()
    return rounds


def check_rounds(path: str, world_size: int, period) -> None:
    results = run_processes(averaging_worker, world_size, path, period)
    expected = reference_rounds(path, world_size, period)
    assert [r["step"] for r in results[0]] == [r["step"] for r in expected]
    for index, reference in enumerate(expected):
        afters = [results[rank][index]["after"] for rank in range(world_size)]
        for rank in range(1, world_size):  # every replica holds the very same weights
            assert all(torch.equal(a, b) for a, b in zip(afters[0], afters[rank]))
        befores = [results[rank][index]["before"] for rank in range(world_size)]
        mean = [torch.stack(group).mean(dim=0) for group in zip(*befores)]
        for got, value in zip(afters[0], mean):  # the mean of what the replicas held
            torch.testing.assert_close(got, value, rtol=1e-6, atol=1e-7)
        for rank in range(world_size):  # and the replicas trained as independent ones would
            for got, value in zip(befores[rank], reference["before"][rank]):
                torch.testing.assert_close(got, value, rtol=1e-5, atol=1e-6)
        for got, value in zip(afters[0], reference["after"]):
            torch.testing.assert_close(got, value, rtol=1e-5, atol=1e-6)


def test_every_few_steps_with_three_workers(tmp_path):
    # 3 shares of 34, 33, 33 rows: 5 steps per epoch, so rounds at steps 4, 8 and the epoch ends 5, 10
    path = write_dataset(tmp_path / "data", rows=100, seed=1)
    check_rounds(path, 3, PERIOD)


def test_every_epoch_with_two_workers(tmp_path):
    path = write_dataset(tmp_path / "data", rows=2 * BATCH * 10, seed=2)
    check_rounds(path, 2, "epoch")
