"""Background validation evaluates the model the algorithm would save at that moment.

Synchronous EASGD saves its centre, so a validation between elastic rounds evaluates the centre,
not rank 0's replica, and gives the replica back untouched. Model averaging saves the mean of
the replicas, which no rank holds between two averages: a validation due then waits for the next
average. Asynchronous EASGD's server holds the centre as its model. Ranks are threads over the
in-process communicator; the test set is a few rows in memory.
"""

from __future__ import annotations

import copy
import threading

import numpy as np
import torch
from torch.nn import functional

from shoal.algorithms import make_algorithm
from shoal.cluster.collectives import unpack_from
from shoal.cluster.fake import run_ranks
from shoal.events import EventLog, Validation, read_history
from shoal.train.objective import Objective, evaluate
from shoal.train.validation import Validator
from tests.distributed.common import CLASSES, FEATURES, parameters, small_model

OBJECTIVE = Objective("cross_entropy", CLASSES)
SEEDING = threading.Lock()  # ranks are threads: the global generator must not interleave their draws


def held_out() -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(7)
    return generator.normal(size=(40, FEATURES)).astype(np.float32), generator.integers(0, CLASSES, size=40)


def convert(features, labels):
    return torch.from_numpy(features), torch.from_numpy(labels)


def train_step(model, optimizer, algorithm, step: int, generator: torch.Generator) -> None:
    """One step as the training loop takes it, on rows of this rank's own."""
    inputs, labels = torch.randn(8, FEATURES, generator=generator), torch.randint(0, CLASSES, (8,), generator=generator)
    optimizer.zero_grad(set_to_none=True)
    functional.cross_entropy(model(inputs), labels).backward()
    algorithm.after_backward(8)
    optimizer.step()
    algorithm.after_step(step)


def collective_rank(comm, name: str, options: dict, steps: int, run_dir, offers: list[int] | None = None) -> dict:
    """Train `steps` steps; rank 0 offers a validation after each step (every one is due)."""
    with SEEDING:
        model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    algorithm = make_algorithm(name, options)
    algorithm.setup(model, optimizer, comm)
    validator = None
    if comm.rank == 0:
        validator = Validator(model, OBJECTIVE, held_out(), convert, EventLog(run_dir), every=1, algorithm=algorithm)
    generator = torch.Generator().manual_seed(100 + comm.rank)  # the replicas drift apart
    started = []
    for step in range(1, steps + 1):
        train_step(model, optimizer, algorithm, step, generator)
        if validator is not None:
            validator.offer(step)
            validator.close()  # one at a time, so every offer that is due starts one
            started.append(validator.last_count == step)
    result = {"parameters": parameters(model), "started": started, "algorithm": algorithm}
    if validator is not None:
        result["shadow"] = parameters(validator.shadow)
    return result


def validations(run_dir) -> list[Validation]:
    return read_history(run_dir).of(Validation)


def test_synchronous_easgd_validates_the_centre_not_the_replica(tmp_path):
    ranks = run_ranks(2, lambda comm: collective_rank(comm, "easgd", {"synchronous": True, "period": 2}, 3,
                                                      tmp_path))
    first = ranks[0]
    algorithm = first["algorithm"]
    centre = [tensor.clone() for tensor in first["parameters"]]
    unpack_from(algorithm.centre, centre)
    assert not torch.equal(algorithm.centre, torch.cat([p.reshape(-1) for p in first["parameters"]]))
    for shadow, expected in zip(first["shadow"], centre, strict=True):  # after step 3: the centre of step 2
        assert torch.equal(shadow, expected)
    for live, replica in zip(parameters(algorithm.model), first["parameters"], strict=True):
        assert torch.equal(live, replica)  # the replica got its own weights back

    reference = copy.deepcopy(algorithm.model)
    unpack_from(algorithm.centre, [p.data for p in reference.parameters()])
    recorded = validations(tmp_path)
    assert [record.count for record in recorded] == [1, 2, 3]
    assert recorded[-1].test == evaluate(reference, OBJECTIVE, *held_out(), convert=convert)
    with algorithm.consensus() as saved:  # what the coordinator saves
        assert recorded[-1].test == evaluate(saved, OBJECTIVE, *held_out(), convert=convert)


def test_model_averaging_validates_only_the_mean_of_the_replicas(tmp_path):
    ranks = run_ranks(2, lambda comm: collective_rank(comm, "averaging", {"period": 2}, 4, tmp_path))
    assert ranks[0]["started"] == [False, True, False, True]  # steps 1 and 3: rank 0's replica is not the mean
    assert [record.count for record in validations(tmp_path)] == [2, 4]
    for mine, theirs, shadow in zip(ranks[0]["parameters"], ranks[1]["parameters"], ranks[0]["shadow"],
                                    strict=True):
        assert torch.equal(mine, theirs)  # step 4 averaged: every replica is the mean
        assert torch.equal(shadow, mine)


def test_model_averaging_each_epoch_leaves_validation_to_the_epochs_end(tmp_path):
    ranks = run_ranks(2, lambda comm: collective_rank(comm, "averaging", {"period": "epoch"}, 3, tmp_path))
    assert ranks[0]["started"] == [False, False, False] and validations(tmp_path) == []
    algorithm = ranks[0]["algorithm"]
    assert not algorithm.holds_consensus()


def test_without_an_algorithm_the_model_itself_is_validated(tmp_path):
    model = small_model(seed=3)
    validator = Validator(model, OBJECTIVE, held_out(), convert, EventLog(tmp_path), every=1)
    validator.offer(1)
    validator.close()
    assert all(torch.equal(a, b) for a, b in zip(parameters(validator.shadow), parameters(model), strict=True))
    assert validations(tmp_path)[0].test == evaluate(model, OBJECTIVE, *held_out(), convert=convert)


def server_rank(comm, run_dir) -> dict:
    """Asynchronous EASGD: the server validates after every update it applies."""
    with SEEDING:
        model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    algorithm = make_algorithm("easgd", {"period": 1})
    holder = {}
    algorithm.setup(model, optimizer, comm, on_update=lambda version: holder["validator"].offer(version))
    algorithm.plan(2)
    if comm.rank == 0:
        holder["validator"] = Validator(model, OBJECTIVE, held_out(), convert, EventLog(run_dir), every=2,
                                        algorithm=algorithm)
        algorithm.serve_epoch(0)
        holder["validator"].close()
        return {"centre": parameters(model), "shadow": parameters(holder["validator"].shadow)}
    generator = torch.Generator().manual_seed(5)
    for step in (1, 2):
        train_step(model, optimizer, algorithm, step, generator)
    return {"replica": parameters(model)}


def test_asynchronous_easgd_server_validates_its_centre(tmp_path):
    server, trainer = run_ranks(2, lambda comm: server_rank(comm, tmp_path))
    assert [record.count for record in validations(tmp_path)] == [2]
    for shadow, centre, replica in zip(server["shadow"], server["centre"], trainer["replica"], strict=True):
        assert torch.equal(shadow, centre) and not torch.equal(shadow, replica)
