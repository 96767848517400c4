"""Parameter-server algorithms driven in one process by the fake communicator (no processes, no ports).

The same properties the multi-process tests check, in a second: the roles of every rank, the
server's update callback, Downpour with one trainer against plain training with the server's
optimizer, and hierarchical Downpour's update count.
"""

from __future__ import annotations

import threading

import torch
from torch.nn import functional

from shoal.algorithms import Role, ServerAlgorithm, make_algorithm, role, trainer_ranks
from shoal.cluster.fake import run_ranks
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.data.partition import steps_per_epoch
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, parameters, rank_batches, small_model, write_dataset

BATCH, SEED, EPOCHS = 8, 3, 2
SEEDING = threading.Lock()  # ranks are threads: the global generator must not interleave their draws


def drive(comm, path: str, name: str, options: dict, groups: int = 1):
    """One rank as the runner drives it: the server and relays serve, trainers train."""
    with SEEDING:
        model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    algorithm = make_algorithm(name, options, groups)
    algorithm.check(comm.world_size)
    versions = []
    algorithm.setup(model, optimizer, comm, on_update=versions.append)
    trainers = trainer_ranks(algorithm, comm.world_size)
    dataset = open_dataset(path)
    algorithm.plan(steps_per_epoch(dataset.rows, len(trainers), BATCH))
    if role(algorithm, comm.rank, comm.world_size) is Role.TRAINER:
        loader = ShardLoader(dataset, rank=trainers.index(comm.rank), world_size=len(trainers), batch_size=BATCH,
                             seed=SEED)
        trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
        for epoch in range(EPOCHS):
            trainer.train_epoch(epoch)
    else:
        for epoch in range(EPOCHS):
            algorithm.serve_epoch(epoch)
    return {"parameters": parameters(model), "versions": versions, "report": algorithm.epoch_report(),
            "version": algorithm.version}


def test_roles_of_a_hierarchical_server_job():
    algorithm = make_algorithm("downpour", {}, groups=2)
    assert isinstance(algorithm, ServerAlgorithm)
    assert [role(algorithm, rank, 7) for rank in range(7)] == [Role.SERVER, Role.RELAY, Role.RELAY] + [Role.TRAINER] * 4
    assert trainer_ranks(algorithm, 7) == [3, 4, 5, 6]
    assert algorithm.links(3, 7) == (1, []) and algorithm.links(1, 7) == (0, [3, 4])


def test_collective_algorithms_train_on_every_rank():
    for name, options in (("sync", {}), ("averaging", {}), ("easgd", {"synchronous": True})):
        algorithm = make_algorithm(name, options)
        assert [role(algorithm, rank, 3) for rank in range(3)] == [Role.TRAINER] * 3


def test_downpour_with_one_trainer_is_plain_training_with_the_servers_optimizer(tmp_path):
    path = write_dataset(tmp_path / "data", rows=41)
    server, trainer = run_ranks(2, lambda comm: drive(comm, path, "downpour", {}))

    features, labels = open_dataset(path).read_all()
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(EPOCHS):
        for (rows,) in rank_batches(path, 1, BATCH, SEED, epoch):
            optimizer.zero_grad()
            functional.cross_entropy(model(torch.from_numpy(features[rows])), torch.from_numpy(labels[rows])).backward()
            optimizer.step()
    for actual in (server["parameters"], trainer["parameters"]):
        for mine, reference in zip(actual, parameters(model), strict=True):
            torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-6)
    updates = EPOCHS * steps_per_epoch(41, 1, BATCH)
    assert server["versions"] == list(range(1, updates + 1))  # the callback saw every update, in order
    assert trainer["versions"] == []  # trainers apply no updates
    assert server["report"]["staleness"]["max"] == 0


def test_hierarchical_downpour_accounts_for_every_update(tmp_path):
    path = write_dataset(tmp_path / "data", rows=80)  # 4 trainers x 20 rows: 3 steps an epoch
    results = run_ranks(7, lambda comm: drive(comm, path, "downpour", {}, groups=2), timeout=20)
    rounds = EPOCHS * steps_per_epoch(80, 4, BATCH)
    assert results[0]["version"] == 2 * rounds  # each sub-master sends one combined update per round
    assert results[0]["report"]["updates"] == 2 * rounds  # no report was taken in between: all of them
    for relay in results[1:3]:
        assert relay["version"] <= results[0]["version"]
