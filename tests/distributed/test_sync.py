"""Synchronous SGD: N workers with batch b take the same steps as one worker with batch N*b."""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional

from shoal.algorithms.sync import SynchronousSGD
from shoal.cluster.collectives import Communicator
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, parameters, rank_batches, small_model, write_dataset
from tests.distributed.harness import run_processes

BATCH, SEED, EPOCHS = 8, 5, 2


def optimizer_for(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def sync_worker(rank: int, world_size: int, path: str):
    model = small_model()
    optimizer = optimizer_for(model)
    comm = Communicator(rank, world_size)
    algorithm = SynchronousSGD()
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(open_dataset(path), rank=rank, world_size=world_size, batch_size=BATCH, seed=SEED)
    trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
    for epoch in range(EPOCHS):
        trainer.train_epoch(epoch)
    return {"parameters": parameters(model), "steps": trainer.global_step}


def test_two_workers_equal_one_worker_with_double_batch(tmp_path):
    world_size = 2
    path = write_dataset(tmp_path / "data", rows=world_size * BATCH * 12)
    results = run_processes(sync_worker, world_size, path)
    assert results[0]["steps"] == results[1]["steps"] == EPOCHS * 12 >= 20

    features, labels = open_dataset(path).read_all()
    model = small_model()
    optimizer = optimizer_for(model)
    for epoch in range(EPOCHS):
        for step_rows in rank_batches(path, world_size, BATCH, SEED, epoch):
            rows = np.concatenate(step_rows)  # the global batch of 2b rows
            optimizer.zero_grad()
            loss = functional.cross_entropy(model(torch.from_numpy(features[rows])), torch.from_numpy(labels[rows]))
            loss.backward()
            optimizer.step()
    for rank in range(world_size):
        for got, expected in zip(results[rank]["parameters"], parameters(model)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


def test_uneven_last_batches_are_weighted_by_rows(tmp_path):
    """Shares of 50 and 49 rows: the last batches differ by a row and the mean stays exact."""
    world_size = 2
    path = write_dataset(tmp_path / "data", rows=99, seed=3)
    results = run_processes(sync_worker, world_size, path)
    features, labels = open_dataset(path).read_all()
    model = small_model()
    optimizer = optimizer_for(model)
    for epoch in range(EPOCHS):
        for step_rows in rank_batches(path, world_size, BATCH, SEED, epoch):
            rows = np.concatenate(step_rows)
            optimizer.zero_grad()
            functional.cross_entropy(model(torch.from_numpy(features[rows])), torch.from_numpy(labels[rows])).backward()
            optimizer.step()
    for got, expected in zip(results[0]["parameters"], parameters(model)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
