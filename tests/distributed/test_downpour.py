"""Parameter-server algorithms against references the tests compute themselves.

Downpour with one trainer is plain training with the server's optimizer; synchronous Downpour
with N trainers is synchronous SGD on the same rows; asynchronous EASGD, replayed in the order
the server took the updates, is the textbook recurrence; hierarchical Downpour (2 groups with
sub-masters) trains to the end with every update accounted for.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from shoal.algorithms import make_algorithm
from shoal.algorithms.elastic_server import AsynchronousElasticAveraging
from shoal.cluster.collectives import Communicator
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.errors import ConfigError
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, parameters, rank_batches, small_model, write_dataset
from tests.distributed.harness import run_processes

BATCH, SEED, EPOCHS = 8, 3, 2


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=0.01)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def serve_or_train(rank, world_size, path, name, options, groups=1, make_optimizer=adam, record=False):
    """One rank of a server algorithm, as the runner drives it: the server serves, trainers train."""
    model = small_model()
    optimizer = make_optimizer(model)
    comm = Communicator(rank, world_size)
    algorithm = make_algorithm(name, options, groups)
    algorithm.check(world_size)
    algorithm.setup(model, optimizer, comm)
    trainers = algorithm.trainer_ranks(world_size)
    dataset = open_dataset(path)
    order = []
    if record:  # the server's order of service, for the replay
        receive = algorithm.receive_update

        def recording(copy=True):
            source, message = receive(copy)
            order.append(source)
            return source, message

        algorithm.receive_update = recording
    if rank in trainers:
        loader = ShardLoader(dataset, rank=trainers.index(rank), world_size=len(trainers), batch_size=BATCH, seed=SEED)
        algorithm.plan(loader.steps)
        trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
        for epoch in range(EPOCHS):
            trainer.train_epoch(epoch)
    else:
        from shoal.data.partition import steps_per_epoch

        algorithm.plan(steps_per_epoch(dataset.rows, len(trainers), BATCH))
        for epoch in range(EPOCHS):
            algorithm.serve_epoch(epoch)
    return {"parameters": parameters(model), "order": order, "report": algorithm.epoch_report(),
            "version": getattr(algorithm, "version", None)}


def assert_close(actual, expected, rtol=1e-5, atol=1e-6):
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol)


def test_downpour_with_one_trainer_is_plain_training_with_the_servers_optimizer(tmp_path):
    path = write_dataset(tmp_path / "data", rows=101)
    server, trainer = run_processes(serve_or_train, 2, path, "downpour", {})

    features, labels = open_dataset(path).read_all()
    model = small_model()
    optimizer = adam(model)
    for epoch in range(EPOCHS):
        for (rows,) in rank_batches(path, 1, BATCH, SEED, epoch):
            optimizer.zero_grad()
            functional.cross_entropy(model(torch.from_numpy(features[rows])), torch.from_numpy(labels[rows])).backward()
            optimizer.step()
    assert_close(server["parameters"], parameters(model))
    assert_close(trainer["parameters"], parameters(model))  # the last reply carried the server's weights
    assert server["report"]["staleness"]["max"] == 0  # one trainer: never stale


def test_synchronous_downpour_is_synchronous_sgd_on_the_same_rows(tmp_path):
    path = write_dataset(tmp_path / "data", rows=150)
    results = run_processes(serve_or_train, 3, path, "downpour", {"synchronous": True})
    sync = run_processes(_sync_worker, 2, path)
    for result in results:
        assert_close(result["parameters"], sync[0]["parameters"])
    assert results[0]["report"]["staleness"]["max"] == 0


def _sync_worker(rank, world_size, path):
    model = small_model()
    optimizer = adam(model)
    comm = Communicator(rank, world_size)
    algorithm = make_algorithm("sync", {})
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(open_dataset(path), rank=rank, world_size=world_size, batch_size=BATCH, seed=SEED)
    trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
    for epoch in range(EPOCHS):
        trainer.train_epoch(epoch)
    return {"parameters": parameters(model)}


def test_downpour_accumulates_sync_every_batches_per_update(tmp_path):
    path = write_dataset(tmp_path / "data", rows=96)  # 2 trainers x 48 rows: 6 steps an epoch
    results = run_processes(serve_or_train, 3, path, "downpour", {"sync_every": 4})
    report = results[0]["report"]  # asked once, after both epochs
    assert report["updates"] == 2 * 2 * EPOCHS  # 6 steps -> 2 updates per trainer and epoch (4 + the 2 left)
    assert results[0]["version"] == 2 * 2 * EPOCHS


def test_asynchronous_easgd_replays_as_the_textbook_recurrence(tmp_path):
    alpha, period, momentum = 0.3, 3, 0.5
    path = write_dataset(tmp_path / "data", rows=96)  # 2 trainers x 48 rows: 6 steps an epoch, 2 rounds
    options = {"elastic_force": alpha, "period": period, "momentum": momentum}
    results = run_processes(serve_or_train, 3, path, "easgd", options, 1, sgd, True)
    order = results[0]["order"]
    assert sorted(order) == [1] * 4 + [2] * 4

    features, labels = open_dataset(path).read_all()
    replicas = [small_model(), small_model()]
    optimizers = [sgd(replica) for replica in replicas]
    centre = [p.detach().clone() for p in small_model().parameters()]
    velocity = [torch.zeros_like(c) for c in centre]
    batches = [[], []]  # each trainer's batches, in its order, over all epochs
    for epoch in range(EPOCHS):
        for step in rank_batches(path, 2, BATCH, SEED, epoch):
            for trainer in range(2):
                batches[trainer].append(step[trainer])
    done = [0, 0]
    for source in order:
        trainer = source - 1
        model, optimizer = replicas[trainer], optimizers[trainer]
        for rows in batches[trainer][done[trainer] : done[trainer] + period]:
            optimizer.zero_grad()
            functional.cross_entropy(model(torch.from_numpy(features[rows])), torch.from_numpy(labels[rows])).backward()
            optimizer.step()
        done[trainer] += period
        with torch.no_grad():
            for weight, middle, speed in zip(model.parameters(), centre, velocity):
                difference = alpha * (weight - middle)
                speed.mul_(momentum).add_(difference)
                middle.add_(speed)
                weight.sub_(difference)
    assert_close(results[0]["parameters"], centre)
    for trainer in range(2):
        assert_close(results[1 + trainer]["parameters"], parameters(replicas[trainer]))


def test_hierarchical_downpour_with_two_groups_trains_to_the_end(tmp_path):
    path = write_dataset(tmp_path / "data", rows=160)  # 4 trainers x 40 rows: 5 steps an epoch
    results = run_processes(serve_or_train, 7, path, "downpour", {}, 2, timeout=150)
    top = results[0]
    assert top["report"]["updates"] == 2 * 5 * EPOCHS  # each sub-master sends one combined update per round
    assert top["version"] == 2 * 5 * EPOCHS
    for relay in results[1:3]:
        assert relay["version"] <= top["version"]
    for result in results:
        assert all(torch.isfinite(p).all() for p in result["parameters"])


def test_asynchronous_easgd_refuses_groups():
    algorithm = make_algorithm("easgd", {}, groups=2)
    assert isinstance(algorithm, AsynchronousElasticAveraging)
    with pytest.raises(ConfigError, match=r"^cluster\.groups: asynchronous EASGD has no groups"):
        algorithm.check(7)
