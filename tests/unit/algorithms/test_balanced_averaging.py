"""Model averaging on shares sized to speed: each replica weighs by the rows it trained since the last round.

A worker given twice the rows takes twice the steps of the job's batch size between rounds, so its
replica carries twice the data and counts twice in the mean. Rounds are counted on the nominal clock,
so every worker enters each one at the same fraction of its share. Ranks are threads of the fake
communicator: no processes.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch
from torch import nn
from torch.nn import functional

from shoal.algorithms.averaging import AveragingOptions, ModelAveraging
from shoal.algorithms.base import model_state
from shoal.cluster.fake import run_ranks
from shoal.data.balance import weighted_plan
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, FEATURES, small_model, write_dataset
from tests.support.shares import worker_batches

SEEDING = threading.Lock()  # ranks are threads: model construction seeds the global generator


def fill(model: nn.Module, value: float) -> None:
    """Every parameter and batch-norm statistic of `model` to `value`."""
    with torch.no_grad():
        for tensor in model_state(model):
            tensor.fill_(value)


def averaged(comm, rows: list[list[int]], groups=1, weigh=True) -> list[float]:
    """Rank r's replica holds r + 1 and trained rows[r] (in batches); the value of each tensor after a round."""
    with SEEDING:
        model = nn.Sequential(nn.Linear(FEATURES, 4), nn.BatchNorm1d(4))
    algorithm = ModelAveraging(AveragingOptions(period=4, group_period=2) if groups != 1 else AveragingOptions(),
                               groups)
    algorithm.weigh_by_rows = weigh
    algorithm.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), comm)  # every rank starts from rank 0's
    fill(model, float(comm.rank + 1))  # then the replicas part, as training parts them
    for batch in rows[comm.rank]:
        algorithm.after_backward(batch)
    values = []
    if groups != 1:
        algorithm.average_group_()
        values.append(model_state(model)[0].flatten()[0].item())
    algorithm.average_()
    state = model_state(model)
    assert all(torch.equal(tensor, torch.full_like(tensor, state[0].flatten()[0])) for tensor in state)
    values.append(state[0].flatten()[0].item())
    algorithm.average_()  # no worker trained since: the replicas are the mean already and stay so
    values.append(model_state(model)[0].flatten()[0].item())
    return values


def test_the_average_weighs_each_replica_by_its_rows():
    rows = [[20, 10], [10], [8, 8, 4]]  # 30, 10 and 20 rows since the last round
    mean = (30 * 1 + 10 * 2 + 20 * 3) / 60
    for values in run_ranks(3, lambda comm: averaged(comm, rows)):
        assert values == pytest.approx([mean, mean], rel=1e-6)


def test_without_weighing_the_average_is_the_plain_mean():
    rows = [[30], [10], [20]]
    for values in run_ranks(3, lambda comm: averaged(comm, rows, weigh=False)):
        assert values == pytest.approx([2.0, 2.0], rel=1e-6)


def test_a_group_round_then_a_round_of_all_is_the_row_weighted_mean_of_all():
    rows = [[10], [30], [20], [20]]
    group_means = [(10 * 1 + 30 * 2) / 40] * 2 + [(20 * 3 + 20 * 4) / 40] * 2
    overall = (10 * 1 + 30 * 2 + 20 * 3 + 20 * 4) / 80  # the group round leaves the weights of all as they were
    results = run_ranks(4, lambda comm: averaged(comm, rows, groups=[[0, 1], [2, 3]]))
    for rank, values in enumerate(results):
        assert values == pytest.approx([group_means[rank], overall, overall], rel=1e-6)


# ---------------------------------------------------------------- trained through the loop, on own-steps shares

BATCH, SEED, EPOCHS, ROWS = 8, 13, 2, 96
PLAN = weighted_plan(ROWS, [2.0, 1.0], BATCH, same_steps=False)  # 64 and 32 rows: 8 and 4 steps, nominal 6


class RecordingAveraging(ModelAveraging):
    """Counts the rounds across all workers, with the rows each worker brought to them."""

    def setup(self, model, optimizer, comm) -> None:
        super().setup(model, optimizer, comm)
        self.rounds: list[tuple[int, int]] = []  # (nominal step, rows)

    def average_(self) -> None:
        self.rounds.append((self.step_count, self.rows[0]))
        super().average_()


def optimizer_for(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def averaging_rank(comm, path: str, period):
    with SEEDING:
        model = small_model()
    optimizer = optimizer_for(model)
    algorithm = RecordingAveraging(AveragingOptions(period=period))
    algorithm.weigh_by_rows = True
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(open_dataset(path), rank=comm.rank, world_size=comm.world_size, batch_size=BATCH,
                         seed=SEED, plan=PLAN)
    trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
    for epoch in range(EPOCHS):
        trainer.train_epoch(epoch)
    return {"state": [t.clone() for t in model_state(model)], "rounds": algorithm.rounds,
            "steps": trainer.global_step}


def reference(path: str, period) -> list[torch.Tensor]:
    """Two replicas trained alone; at each round (nominal step k, where each worker has done the same fraction
    k / nominal of its steps: ceil(k * steps / nominal)) replaced by their mean weighted by the rows since."""
    features, labels = open_dataset(path).read_all()
    replicas = [small_model(), small_model()]
    optimizers = [optimizer_for(model) for model in replicas]
    every = PLAN.nominal if period == "epoch" else period
    for epoch in range(EPOCHS):
        done = [0, 0]
        batches = [worker_batches(PLAN, worker, SEED, epoch) for worker in range(2)]
        for nominal in range(every, PLAN.nominal + 1, every):
            trained = [0, 0]
            for worker, (model, optimizer) in enumerate(zip(replicas, optimizers)):
                until = math.ceil(nominal * PLAN.steps[worker] / PLAN.nominal)
                for rows in batches[worker][done[worker]:until]:
                    optimizer.zero_grad()
                    functional.cross_entropy(model(torch.from_numpy(features[rows])),
                                             torch.from_numpy(labels[rows])).backward()
                    optimizer.step()
                    trained[worker] += len(rows)
                done[worker] = until
            with torch.no_grad():
                for tensors in zip(*(model_state(model) for model in replicas)):
                    mean = (trained[0] * tensors[0] + trained[1] * tensors[1]) / sum(trained)
                    for tensor in tensors:
                        tensor.copy_(mean)
        assert done == list(PLAN.steps)
    return model_state(replicas[0])


@pytest.mark.parametrize("period", ["epoch", 3, 2])
def test_replicas_on_own_steps_meet_on_the_nominal_clock_and_weigh_by_rows(tmp_path, period):
    assert PLAN.shares == (64, 32) and PLAN.steps == (8, 4) and PLAN.nominal == 6
    path = write_dataset(tmp_path / "data", rows=ROWS, seed=4)
    results = run_ranks(2, lambda comm: averaging_rank(comm, path, period), timeout=20)
    every = PLAN.nominal if period == "epoch" else period
    rounds = [epoch * PLAN.nominal + k for epoch in range(EPOCHS) for k in range(every, PLAN.nominal + 1, every)]
    for worker, result in enumerate(results):
        assert result["steps"] == EPOCHS * PLAN.steps[worker]
        assert [step for step, _ in result["rounds"]] == rounds  # every worker entered every round, once
        # at round k a worker has taken ceil(k * steps / nominal) of its steps: the same fraction of its share
        taken = [0] + [math.ceil(k * PLAN.steps[worker] / PLAN.nominal) for k in range(every, PLAN.nominal + 1, every)]
        sizes = [hi - lo for lo, hi in PLAN.bounds(worker)]
        brought = [sum(sizes[a:b]) for a, b in zip(taken, taken[1:])]
        assert [rows for _, rows in result["rounds"]] == brought * EPOCHS
    for mine, theirs, expected in zip(results[0]["state"], results[1]["state"], reference(path, period), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)  # the replicas hold the consensus
        torch.testing.assert_close(mine, expected, rtol=1e-5, atol=1e-6)


def test_with_one_group_a_group_round_is_a_round_of_all_and_starts_the_row_count_again():
    """One group: its rounds (every group_period) are rounds of every worker; the next round across all
    workers must weigh the rows since that one, not since the last `period` (a resumed job starts from 0)."""
    def rounds(comm):
        with SEEDING:
            model = nn.Sequential(nn.Linear(FEATURES, 4))
        algorithm = ModelAveraging(AveragingOptions(period=4, group_period=2), 1)
        algorithm.weigh_by_rows = True
        algorithm.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), comm)
        algorithm.after_backward(10 * (comm.rank + 1))
        algorithm.after_step(1)
        algorithm.after_backward(10 * (comm.rank + 1))
        algorithm.after_step(2)  # the group round: every worker
        counted = list(algorithm.rows)
        fill(model, float(comm.rank + 1))
        algorithm.after_backward(3 if comm.rank == 0 else 1)
        algorithm.after_step(3)
        algorithm.after_step(4)  # the round across all, weighed by steps 3-4's rows only
        return counted, model_state(model)[0].flatten()[0].item()

    for counted, value in run_ranks(2, rounds):
        assert counted == [0, 0]
        assert value == pytest.approx((3 * 1 + 1 * 2) / 4, rel=1e-6)


def test_a_group_rounds_time_is_communication_of_the_job_as_well():
    """The loop reads the job's communicator for its time split and speed shares its rates: time spent in a
    group's sub-communicator must count there too, or a fast worker's wait in a group round looks like work."""
    def timed(comm):
        group = comm.split([[0, 1]])
        before = comm.seconds
        group.all_reduce_sum_(torch.ones(3))
        return group.seconds, comm.seconds - before

    for own, parent in run_ranks(2, timed):
        assert own > 0 and parent == pytest.approx(own)


def test_a_per_step_schedule_keeps_to_the_nominal_clock_on_every_worker(tmp_path):
    """A faster worker takes more steps: its per-step schedule (OneCycleLR sized by the job's steps) moves
    once per nominal step, as every other worker's, never past its total."""
    from shoal.train.schedule import make_schedule

    path = write_dataset(tmp_path / "data", ROWS)
    total = EPOCHS * PLAN.nominal

    def scheduled(comm):
        with SEEDING:
            model = small_model()
        optimizer = optimizer_for(model)
        schedule = make_schedule({"name": "OneCycleLR", "max_lr": 0.1, "total_steps": total}, optimizer)
        algorithm = ModelAveraging(AveragingOptions(period="epoch"))
        algorithm.weigh_by_rows = True
        algorithm.setup(model, optimizer, comm)
        loader = ShardLoader(open_dataset(path), rank=comm.rank, world_size=comm.world_size, batch_size=BATCH,
                             seed=SEED, plan=PLAN)
        trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm,
                          schedule=schedule)
        for epoch in range(EPOCHS):
            trainer.train_epoch(epoch)
        return trainer.global_step, optimizer.param_groups[0]["lr"]

    (fast_steps, fast_lr), (slow_steps, slow_lr) = run_ranks(2, scheduled)
    assert (fast_steps, slow_steps) == (EPOCHS * PLAN.steps[0], EPOCHS * PLAN.steps[1])  # 16 and 8 steps
    assert fast_lr == slow_lr  # the same point of the cycle: its last step
