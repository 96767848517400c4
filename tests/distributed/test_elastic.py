"""Synchronous EASGD: workers and centre move exactly as the elastic update written out here says."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn
from torch.nn import functional

from shoal.algorithms import make_algorithm
from shoal.algorithms.elastic import ElasticAveraging, ElasticOptions
from shoal.cluster.collectives import Communicator
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.errors import ConfigError
from shoal.jobs import from_dict
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, FEATURES, parameters, rank_batches, small_model, write_dataset
from tests.distributed.harness import run_processes

BATCH, SEED, EPOCHS, PERIOD, ALPHA = 8, 3, 2, 3, 0.3


def batch_norm_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # no bias before batch norm: its gradient is rounding noise, which Adam would amplify
    return nn.Sequential(nn.Linear(FEATURES, 16, bias=False), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, CLASSES))


MODELS = {"plain": small_model, "batch_norm": batch_norm_model}


def optimizer_for(model):
    return torch.optim.Adam(model.parameters(), lr=0.01)


def float_buffers(model) -> list[torch.Tensor]:
    return [b.detach().clone() for b in model.buffers() if b.is_floating_point()]


def elastic(momentum: float) -> ElasticAveraging:
    return ElasticAveraging(ElasticOptions(elastic_force=ALPHA, period=PERIOD, momentum=momentum, synchronous=True))


def trainer_for(rank, world_size, path, model, algorithm):
    optimizer = optimizer_for(model)
    comm = Communicator(rank, world_size)
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(open_dataset(path), rank=rank, world_size=world_size, batch_size=BATCH, seed=SEED)
    return Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm), optimizer


def elastic_worker(rank: int, world_size: int, path: str, momentum: float, model_name: str):
    model = MODELS[model_name]()
    algorithm = elastic(momentum)
    trainer, _ = trainer_for(rank, world_size, path, model, algorithm)
    for epoch in range(EPOCHS):
        trainer.train_epoch(epoch)
    local = parameters(model)
    with algorithm.consensus():
        centre = parameters(model)
    return {"local": local, "centre": centre, "after_consensus": parameters(model), "buffers": float_buffers(model),
            "report": algorithm.epoch_report()}


def reference(path: str, world_size: int, momentum: float, model_name: str) -> dict:
    """Independent replicas with their own optimizers, joined by elastic rounds written out here."""
    features, labels = open_dataset(path).read_all()
    replicas = [MODELS[model_name]() for _ in range(world_size)]
    optimizers = [optimizer_for(replica) for replica in replicas]
    centre = [p.detach().clone() for p in replicas[0].parameters()]
    velocity = [torch.zeros_like(c) for c in centre]
    step = pulled_at = 0

    def elastic_round():
        differences = [[ALPHA * (p.detach() - c) for p, c in zip(replica.parameters(), centre)] for replica in replicas]
        with torch.no_grad():
            for replica, difference in zip(replicas, differences):
                for parameter, d in zip(replica.parameters(), difference):
                    parameter.sub_(d)
        for index, total in enumerate(sum(d[i] for d in differences) for i in range(len(centre))):
            if momentum:
                velocity[index] = momentum * velocity[index] + total
                centre[index] = centre[index] + velocity[index]
            else:
                centre[index] = centre[index] + total

    for epoch in range(EPOCHS):
        for step_rows in rank_batches(path, world_size, BATCH, SEED, epoch):
            step += 1
            for replica, optimizer, rows in zip(replicas, optimizers, step_rows):
                optimizer.zero_grad()
                inputs, targets = torch.from_numpy(features[rows]), torch.from_numpy(labels[rows])
                functional.cross_entropy(replica(inputs), targets).backward()
                optimizer.step()
            if step % PERIOD == 0:
                elastic_round()
                pulled_at = step
        if pulled_at != step:  # every epoch ends with a round
            elastic_round()
            pulled_at = step
        mean_buffers = [torch.stack(group).mean(dim=0) for group in zip(*map(float_buffers, replicas))]
        for replica in replicas:
            for buffer, mean in zip([b for b in replica.buffers() if b.is_floating_point()], mean_buffers):
                buffer.copy_(mean)
    return {"local": [parameters(replica) for replica in replicas], "centre": centre,
            "buffers": float_buffers(replicas[0])}


CASES = {"plain": 0.0, "batch_norm": 0.6}  # model -> momentum of the centre


def worker(rank: int, world_size: int, path: str) -> dict:
    """Every case of this file in one pair of processes (starting them is the slow part)."""
    results = {name: elastic_worker(rank, world_size, path, momentum, name) for name, momentum in CASES.items()}
    results["resume"] = resume_worker(rank, world_size, path)
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    # 40 rows a worker, 5 steps an epoch: rounds at steps 3, 6, 9 and at the epoch ends 5 and 10
    path = write_dataset(tmp_path_factory.mktemp("elastic") / "data", rows=2 * BATCH * 5, seed=4)
    return path, run_processes(worker, 2, path, timeout=100)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model_name", list(CASES))
def test_two_workers_follow_the_elastic_update(runs, model_name):
    path, results = runs
    results = [result[model_name] for result in results]
    expected = reference(path, len(results), CASES[model_name], model_name)
    for rank, result in enumerate(results):
        for got, value in zip(result["local"], expected["local"][rank]):
            torch.testing.assert_close(got, value, rtol=1e-6, atol=1e-6)
        for got, value in zip(result["centre"], expected["centre"]):
            torch.testing.assert_close(got, value, rtol=1e-6, atol=1e-6)
        assert all(torch.equal(a, b) for a, b in zip(result["after_consensus"], result["local"]))
        for got, value in zip(result["buffers"], expected["buffers"]):
            torch.testing.assert_close(got, value, rtol=1e-6, atol=1e-6)
        assert result["report"]["distance_to_centre"] > 0
    assert not all(torch.equal(a, b) for a, b in zip(results[0]["local"], results[1]["local"]))  # replicas differ
    assert all(torch.equal(a, b) for a, b in zip(results[0]["centre"], results[1]["centre"]))  # one centre


def snapshot(state) -> dict:
    """What a checkpoint keeps: written and read back the way checkpoints are."""
    stream = io.BytesIO()
    torch.save(state, stream)
    stream.seek(0)
    return torch.load(stream, weights_only=True)


def resume_worker(rank: int, world_size: int, path: str):
    model = batch_norm_model()
    algorithm = elastic(0.6)
    trainer, optimizer = trainer_for(rank, world_size, path, model, algorithm)
    trainer.train_epoch(0)
    saved = snapshot({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "algorithm": algorithm.state_dict(), "global_step": trainer.global_step})
    trainer.train_epoch(1)
    uninterrupted = parameters(model) + [algorithm.centre.clone()]

    model = batch_norm_model(seed=9)  # other weights: everything must come from the checkpoint
    algorithm = elastic(0.6)
    trainer, optimizer = trainer_for(rank, world_size, path, model, algorithm)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    algorithm.load_state_dict(saved["algorithm"])
    trainer.global_step = saved["global_step"]
    trainer.train_epoch(1)
    return uninterrupted, parameters(model) + [algorithm.centre.clone()]


@pytest.mark.timeout(120)
def test_resumed_job_continues_exactly(runs):
    # 5 steps an epoch and rounds every 3: the resumed epoch starts in the middle of a period
    for result in runs[1]:
        uninterrupted, resumed = result["resume"]
        assert all(torch.equal(a, b) for a, b in zip(uninterrupted, resumed))


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"elastic_force": 0}, "algorithm.elastic_force"),
        ({"elastic_force": 1.0}, "algorithm.elastic_force"),
        ({"elastic_force": True}, "algorithm.elastic_force"),
        ({"momentum": 1.0}, "algorithm.momentum"),
        ({"momentum": -0.1}, "algorithm.momentum"),
        ({"period": 0}, "algorithm.period"),
        ({"period": "often"}, "algorithm.period"),
        ({"group_period": 0}, "algorithm.group_period"),
        ({"period": 4, "group_period": 4}, "algorithm.group_period"),
        ({"synchronous": "yes"}, "algorithm.synchronous"),
    ],
)
def test_bad_options_name_the_key(options, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        ElasticOptions(**options)


def test_bad_option_in_a_job_names_the_key():
    raw = {"model": {"layers": [{"dense": 2}]}, "data": {"train": "somewhere"},
           "algorithm": {"name": "easgd", "elastic_force": 1.5}}
    with pytest.raises(ConfigError, match=r"^algorithm\.elastic_force: must be a number in \(0, 1\)"):
        from_dict(raw)


@pytest.mark.parametrize(
    ("options", "groups", "world_size", "key"),
    [
        ({}, 3, 2, "cluster.groups"),
        ({}, 2, 4, "algorithm.group_period"),
        ({"elastic_force": 0.5}, 1, 3, "algorithm.elastic_force"),  # (3 + 1) * 0.5 = 2: divergent rounds
        ({"elastic_force": 0.5, "group_period": 2}, 2, 6, "algorithm.elastic_force"),  # groups of 3
    ],
)
def test_settings_that_do_not_fit_the_workers_are_refused(options, groups, world_size, key):
    algorithm = make_algorithm("easgd", {"synchronous": True, **options}, groups)
    with pytest.raises(ConfigError, match=f"^{key}: "):
        algorithm.check(world_size)


def test_settings_that_fit_are_accepted():
    make_algorithm("easgd", {"synchronous": True, "elastic_force": 0.45}, 1).check(2)  # the paper's 0.9 / 2
    make_algorithm("easgd", {"synchronous": True, "elastic_force": 0.5, "group_period": 2}, 3).check(6)


def test_synchronous_builds_the_synchronous_variant():
    algorithm = make_algorithm("easgd", {"synchronous": True}, 2)
    assert type(algorithm) is ElasticAveraging and algorithm.groups == 2 and algorithm.supports_groups


def test_asynchronous_builds_the_server_variant():
    server = pytest.importorskip("shoal.algorithms.elastic_server")
    assert isinstance(make_algorithm("easgd", {"synchronous": False}), server.AsynchronousElasticAveraging)
