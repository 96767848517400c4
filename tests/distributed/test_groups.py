"""Hierarchical averaging and EASGD: one group is the flat algorithm; groups round within themselves."""

from __future__ import annotations

import pytest
import torch

from shoal.algorithms import make_algorithm
from shoal.algorithms.averaging import AveragingOptions, ModelAveraging
from shoal.algorithms.base import model_state
from shoal.algorithms.elastic import ElasticAveraging, ElasticOptions
from shoal.algorithms.groups import contiguous_groups
from shoal.cluster.collectives import Communicator
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.errors import ConfigError
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, parameters, small_model, write_dataset
from tests.distributed.harness import run_processes

BATCH, SEED, EPOCHS = 8, 7, 2
GROUP_PERIOD, PERIOD, ALPHA, MOMENTUM = 2, 5, 0.3, 0.5


def train(rank: int, world_size: int, path: str, algorithm) -> torch.nn.Module:
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    comm = Communicator(rank, world_size)
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(open_dataset(path), rank=rank, world_size=world_size, batch_size=BATCH, seed=SEED)
    trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
    for epoch in range(EPOCHS):
        trainer.train_epoch(epoch)
    return model


# ---------------------------------------------------------------- one group == flat


def one_group_worker(rank: int, world_size: int, path: str) -> dict:
    """Each algorithm with one group and flat, from the same start."""
    pairs = {
        "averaging": (ModelAveraging(AveragingOptions(period="epoch", group_period=3), groups=1),
                      ModelAveraging(AveragingOptions(period=3))),
        "easgd": (ElasticAveraging(ElasticOptions(ALPHA, period=5, momentum=MOMENTUM, synchronous=True,
                                                  group_period=3), groups=1),
                  ElasticAveraging(ElasticOptions(ALPHA, period=3, momentum=MOMENTUM, synchronous=True))),
    }
    results = {}
    for name, (grouped, flat) in pairs.items():
        trained = [parameters(train(rank, world_size, path, algorithm)) for algorithm in (grouped, flat)]
        centres = [a.centre.clone() for a in (grouped, flat)] if name == "easgd" else [None, None]
        results[name] = (*trained, *centres)
    return results


@pytest.mark.timeout(150)
def test_one_group_is_the_flat_algorithm(runs):
    # 6 steps an epoch: rounds every 3 steps within the one group, or every 3 steps in the flat job
    results = [result["one_group"] for result in runs]
    for result in results:
        for name, (grouped, flat, grouped_centre, flat_centre) in result.items():
            assert all(torch.equal(a, b) for a, b in zip(grouped, flat)), name
            if name == "easgd":
                assert torch.equal(grouped_centre, flat_centre)
    averaged = [result["averaging"][0] for result in results]  # averaging ends every epoch with the mean
    assert all(all(torch.equal(a, b) for a, b in zip(averaged[0], other)) for other in averaged[1:])
    trained = [result["easgd"][0] for result in results]  # EASGD replicas stay apart
    assert not all(torch.equal(a, b) for a, b in zip(trained[0], trained[1]))


# ---------------------------------------------------------------- 4 workers in 2 groups


def flat_parameters(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


class RecordingAveraging(ModelAveraging):
    """Keeps this replica's weights just before and just after every round."""

    def setup(self, model, optimizer, comm) -> None:
        super().setup(model, optimizer, comm)
        self.rounds = []

    def record(self, kind: str, average) -> None:
        before = [t.clone() for t in model_state(self.model)]
        average()
        self.rounds.append({"kind": kind, "step": self.step_count, "before": before,
                            "after": [t.clone() for t in model_state(self.model)]})

    def average_(self) -> None:
        self.record("all", super().average_)

    def average_group_(self) -> None:
        self.record("group", super().average_group_)


class RecordingElastic(ElasticAveraging):
    """Keeps this replica's weights, centre and velocity just before and just after every round."""

    def setup(self, model, optimizer, comm) -> None:
        super().setup(model, optimizer, comm)
        self.rounds = []

    def state(self) -> dict:
        return {"weights": flat_parameters(self.model), "centre": self.centre.clone(),
                "velocity": self.velocity.clone()}

    def record(self, kind: str, operation) -> None:
        before = self.state()
        operation()
        self.rounds.append({"kind": kind, "step": self.step_count, "before": before, "after": self.state()})

    def elastic_round_(self) -> None:
        self.record("group", super().elastic_round_)

    def average_centres_(self) -> None:
        self.record("all", super().average_centres_)


def grouped_worker(rank: int, world_size: int, path: str) -> dict:
    averaging = RecordingAveraging(AveragingOptions(period=PERIOD, group_period=GROUP_PERIOD), groups=2)
    train(rank, world_size, path, averaging)
    elastic = RecordingElastic(ElasticOptions(ALPHA, period=PERIOD, momentum=MOMENTUM, synchronous=True,
                                              group_period=GROUP_PERIOD), groups=2)
    train(rank, world_size, path, elastic)
    one_group = one_group_worker(rank, world_size, path)
    return {"averaging": averaging.rounds, "easgd": elastic.rounds, "one_group": one_group}


WORLD_SIZE, STEPS_PER_EPOCH = 4, 6


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every distributed case of this file in one set of 4 processes (starting them is the slow part)."""
    path = write_dataset(tmp_path_factory.mktemp("groups") / "data", rows=WORLD_SIZE * BATCH * STEPS_PER_EPOCH, seed=2)
    return run_processes(grouped_worker, WORLD_SIZE, path, timeout=140)


def schedule(steps_per_epoch: int, *, group_rounds_with_all: bool) -> list[tuple[str, int]]:
    """The (kind, step) of every round: group rounds every GROUP_PERIOD, all every PERIOD and at epoch ends."""
    rounds, last = [], {"group": 0, "all": 0}
    for step in range(1, EPOCHS * steps_per_epoch + 1):
        kinds = []
        if step % GROUP_PERIOD == 0 and (group_rounds_with_all or step % PERIOD):
            kinds.append("group")
        if step % PERIOD == 0:
            kinds.append("all")
        if step % steps_per_epoch == 0:  # the epoch's end completes what is pending
            kinds += [k for k in ("group", "all") if k not in kinds and last[k] != step
                      and (group_rounds_with_all or k == "all")]
        for kind in kinds:
            last[kind] = step
            rounds.append((kind, step))
    return rounds


def mean(tensors) -> torch.Tensor:
    return torch.stack(list(tensors)).mean(dim=0)


def check_averaging(results: list[list[dict]], groups: list[list[int]]) -> None:
    for index in range(len(results[0])):
        rounds = [rank_rounds[index] for rank_rounds in results]
        circles = groups if rounds[0]["kind"] == "group" else [sum(groups, [])]
        for members in circles:
            for tensor in range(len(rounds[0]["after"])):
                expected = mean(rounds[rank]["before"][tensor] for rank in members)
                for rank in members:
                    assert torch.equal(rounds[rank]["after"][tensor], rounds[members[0]]["after"][tensor])
                    torch.testing.assert_close(rounds[rank]["after"][tensor], expected, rtol=1e-6, atol=1e-7)
        if rounds[0]["kind"] == "group":  # the groups went their own ways
            assert not torch.equal(rounds[groups[0][0]]["after"][0], rounds[groups[1][0]]["after"][0])


def check_elastic(results: list[list[dict]], groups: list[list[int]]) -> None:
    for index in range(len(results[0])):
        rounds = [rank_rounds[index] for rank_rounds in results]
        before = [r["before"] for r in rounds]
        after = [r["after"] for r in rounds]
        if rounds[0]["kind"] == "group":
            for members in groups:
                centre, velocity = before[members[0]]["centre"], before[members[0]]["velocity"]
                differences = {rank: ALPHA * (before[rank]["weights"] - centre) for rank in members}
                new_velocity = MOMENTUM * velocity + sum(differences.values())
                for rank in members:
                    assert torch.equal(before[rank]["centre"], centre)  # one centre per group
                    assert torch.equal(after[rank]["centre"], after[members[0]]["centre"])
                    torch.testing.assert_close(after[rank]["weights"], before[rank]["weights"] - differences[rank],
                                               rtol=1e-6, atol=1e-7)
                    torch.testing.assert_close(after[rank]["velocity"], new_velocity, rtol=1e-6, atol=1e-7)
                    torch.testing.assert_close(after[rank]["centre"], centre + new_velocity, rtol=1e-6, atol=1e-7)
            assert not torch.equal(after[groups[0][0]]["centre"], after[groups[1][0]]["centre"])
        else:  # the group centres and velocities become their mean; the workers stay where they are
            for key in ("centre", "velocity"):
                expected = mean(state[key] for state in before)
                for rank in range(len(rounds)):
                    assert torch.equal(after[rank][key], after[0][key])
                    torch.testing.assert_close(after[rank][key], expected, rtol=1e-6, atol=1e-7)
            for rank in range(len(rounds)):
                assert torch.equal(after[rank]["weights"], before[rank]["weights"])


@pytest.mark.timeout(150)
def test_four_workers_in_two_groups(runs):
    results, steps_per_epoch = runs, STEPS_PER_EPOCH
    groups = contiguous_groups(WORLD_SIZE, 2)
    assert groups == [[0, 1], [2, 3]]
    for name, with_all in (("averaging", False), ("easgd", True)):
        recorded = [result[name] for result in results]
        expected = schedule(steps_per_epoch, group_rounds_with_all=with_all)
        for rank_rounds in recorded:
            assert [(r["kind"], r["step"]) for r in rank_rounds] == expected, name
    check_averaging([result["averaging"] for result in results], groups)
    check_elastic([result["easgd"] for result in results], groups)


# ---------------------------------------------------------------- layout and settings


def test_groups_are_contiguous_and_nearly_equal():
    assert contiguous_groups(5, 2) == [[0, 1, 2], [3, 4]]
    assert contiguous_groups(7, 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert contiguous_groups(3, 3) == [[0], [1], [2]]
    assert contiguous_groups(4, 1) == [[0, 1, 2, 3]]


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"group_period": 0}, "algorithm.group_period"),
        ({"group_period": 2.5}, "algorithm.group_period"),
        ({"group_period": True}, "algorithm.group_period"),
        ({"period": 4, "group_period": 6}, "algorithm.group_period"),
        ({"period": 0}, "algorithm.period"),
    ],
)
def test_bad_averaging_options_name_the_key(options, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        AveragingOptions(**options)


@pytest.mark.parametrize(
    ("options", "groups", "world_size", "key"),
    [
        ({"group_period": 2}, 5, 4, "cluster.groups"),
        ({}, 2, 4, "algorithm.group_period"),
    ],
)
def test_groups_that_do_not_fit_are_refused(options, groups, world_size, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        make_algorithm("averaging", options, groups).check(world_size)


def test_groups_that_fit_are_accepted():
    make_algorithm("averaging", {"group_period": 2}, 4).check(4)
    make_algorithm("averaging", {"period": "epoch", "group_period": 2}, 1).check(3)
    assert ModelAveraging.supports_groups and ElasticAveraging.supports_groups
