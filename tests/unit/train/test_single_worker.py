"""One worker: every algorithm reduces to plain training with a hand-written PyTorch loop."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from shoal.algorithms import make_algorithm
from shoal.cluster.collectives import Communicator
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, parameters, small_model, write_dataset


@pytest.mark.parametrize("name,options", [("none", {}), ("sync", {}), ("averaging", {"period": "epoch"}),
                                          ("averaging", {"period": 3})])
def test_one_worker_is_plain_training(tmp_path, name, options):
    path = write_dataset(tmp_path / "data", rows=90)
    dataset = open_dataset(path)

    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    comm = Communicator(0, 1)
    algorithm = make_algorithm(name, options)
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(dataset, rank=0, world_size=1, batch_size=16, seed=4)
    trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
    for epoch in range(3):
        trainer.train_epoch(epoch)
    assert comm.seconds == 0.0  # a world of one never communicates

    plain = small_model()
    plain_optimizer = torch.optim.Adam(plain.parameters(), lr=0.01)
    for epoch in range(3):
        for inputs, labels in loader.batches(epoch):
            plain_optimizer.zero_grad()
            functional.cross_entropy(plain(inputs), labels).backward()
            plain_optimizer.step()
    for got, expected in zip(parameters(model), parameters(plain)):
        assert torch.equal(got, expected)
