"""train.scheduler.factory: a scheduler that a function of the optimizer builds (a warm-up then a cosine).

The function is named as "package.module:function" or by the file shoal.fit writes into the run directory.
Its scheduler steps per epoch unless interval = "step", and its state (a SequentialLR's holds its
children's) goes through a checkpoint so that a resumed job's learning rates go on exactly.
"""

from __future__ import annotations

import io
import re
import types

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, ReduceLROnPlateau, SequentialLR, StepLR

from shoal.algorithms.base import Algorithm
from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.errors import ConfigError
from shoal.objects import save_object
from shoal.train.prepare import make_optimizer, prepare
from shoal.train.runner import Runner
from shoal.train.schedule import make_schedule
from shoal.train.state import TrainingState
from tests.unit.train.test_runner import job, weights

HERE = "tests.unit.train.test_schedule_factory"
WARM_STEPS, COSINE_STEPS, STEPS = 4, 6, 12


def warm_then_cosine(optimizer):
    """A linear warm-up over WARM_STEPS, then a cosine over COSINE_STEPS (and on, rising again)."""
    warm = LinearLR(optimizer, start_factor=0.1, total_iters=WARM_STEPS)
    cosine = CosineAnnealingLR(optimizer, T_max=COSINE_STEPS, eta_min=1e-4)
    return SequentialLR(optimizer, [warm, cosine], milestones=[WARM_STEPS])


def by_epochs(optimizer):
    """One epoch of warm-up, then a cosine over two."""
    warm = LinearLR(optimizer, start_factor=0.25, total_iters=1)
    return SequentialLR(optimizer, [warm, CosineAnnealingLR(optimizer, T_max=2)], milestones=[1])


def plateau(optimizer):
    return ReduceLROnPlateau(optimizer, patience=0)


def not_a_scheduler(optimizer):
    return [optimizer]


def failing(optimizer):
    raise KeyError("warmup_steps\nmore")


def of_another_optimizer(optimizer):
    return StepLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), step_size=1)


OPTIMIZER = {"name": "sgd", "lr": 0.1, "momentum": 0.9, "param_groups": [{"params": "^0\\.", "lr": 0.3}]}


def training_state(interval: str = "step") -> TrainingState:
    """A fresh model, the job's optimizer (two param groups) and the function's schedule, as a rank holds them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    optimizer = make_optimizer(OPTIMIZER, model)
    schedule = make_schedule({"factory": f"{HERE}:warm_then_cosine", "interval": interval}, optimizer)
    return TrainingState(model, optimizer, Algorithm(), types.SimpleNamespace(global_step=0), torch.device("cpu"),
                         schedule)


def steps(state: TrainingState, count: int) -> list[list[float]]:
    """`count` training steps, each followed by its schedule step; every group's rate after each."""
    rates = []
    for _ in range(count):
        generator = torch.Generator().manual_seed(state.counter.global_step)  # the step's batch, resumed or not
        state.optimizer.zero_grad()
        state.model(torch.randn(5, 3, generator=generator)).square().mean().backward()
        state.optimizer.step()
        state.schedule.after_step()
        state.counter.global_step += 1
        rates.append([group["lr"] for group in state.optimizer.param_groups])
    return rates


@pytest.mark.parametrize("stop", [2, WARM_STEPS, 7])  # in the warm-up, at its end, in the cosine
def test_a_warm_up_then_cosine_resumed_from_its_state_sets_every_rate_of_an_uninterrupted_run(stop):
    whole = training_state()
    expected = steps(whole, STEPS)

    first = training_state()
    before = steps(first, stop)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)  # as a checkpoint stores it, and loads it back
    buffer.seek(0)
    resumed = training_state()  # a fresh optimizer and scheduler, from the same function
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    after = steps(resumed, STEPS - stop)
    assert before + after == expected
    assert len({rate for rates in expected for rate in rates}) > 10  # the rates did move, in both groups
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name


def test_a_factorys_scheduler_steps_per_epoch_unless_told_per_step():
    for interval, stepped in ((None, "epoch"), ("epoch", "epoch"), ("step", "step")):
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        options = {"factory": f"{HERE}:warm_then_cosine"} | ({"interval": interval} if interval else {})
        schedule = make_schedule(options, optimizer)
        assert schedule.interval == stepped
        start = optimizer.param_groups[0]["lr"]
        optimizer.step()  # no gradient: a step that moves nothing, as torch expects before its scheduler's
        schedule.after_step()
        assert (optimizer.param_groups[0]["lr"] != start) == (stepped == "step")
        moved = optimizer.param_groups[0]["lr"]
        schedule.after_epoch(0.5)
        assert (optimizer.param_groups[0]["lr"] != moved) == (stepped == "epoch")


def test_a_plateau_from_a_factory_steps_on_the_epochs_loss():
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    schedule = make_schedule({"factory": f"{HERE}:plateau"}, optimizer)
    schedule.after_epoch(1.0)
    schedule.after_epoch(2.0)  # no better: patience 0 lowers the rate
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


def test_a_function_written_into_the_run_directory_builds_it(tmp_path):
    save_object(warm_then_cosine, tmp_path / "train.scheduler.factory.pkl", "train.scheduler.factory")
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    schedule = make_schedule({"factory": "train.scheduler.factory.pkl"}, optimizer, tmp_path)
    assert isinstance(schedule.scheduler, SequentialLR)
    with pytest.raises(ConfigError, match="^train.scheduler.factory: 'train.scheduler.factory.pkl' is read from a "
                                          "run directory, and none is given here"):
        make_schedule({"factory": "train.scheduler.factory.pkl"}, optimizer)


@pytest.mark.parametrize(("options", "message"), [
    ({"name": "StepLR", "factory": f"{HERE}:warm_then_cosine"}, "train.scheduler: give either name"),
    ({"factory": f"{HERE}:warm_then_cosine", "T_max": 3}, "train.scheduler.T_max: not a key beside "
                                                          "train.scheduler.factory"),
    ({"factory": f"{HERE}:warm_then_cosine", "interval": "batch"}, "train.scheduler.interval: must be one of"),
    ({"factory": f"{HERE}:plateau", "interval": "step"}, "train.scheduler.interval: ReduceLROnPlateau steps on"),
    ({"factory": "warm_then_cosine"}, "train.scheduler.factory: expected 'package.module:function'"),
    ({"factory": f"{HERE}:missing"}, f"train.scheduler.factory: cannot import '{HERE}:missing'"),
    ({"factory": f"{HERE}:STEPS"}, f"train.scheduler.factory: '{HERE}:STEPS' is a int, not a function"),
    ({"factory": f"{HERE}:not_a_scheduler"}, f"train.scheduler.factory: '{HERE}:not_a_scheduler' must return a "
                                             "torch.optim.lr_scheduler scheduler, got list"),
    ({"factory": f"{HERE}:failing"}, f"train.scheduler.factory: '{HERE}:failing' failed: KeyError: 'warmup_steps"),
    ({"factory": f"{HERE}:of_another_optimizer"}, "train.scheduler.factory: .* returned a scheduler of another "
                                                  "optimizer"),
])
def test_a_bad_factory_is_one_line_naming_the_key(options, message):
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    with pytest.raises(ConfigError) as raised:
        make_schedule(options, optimizer)
    assert re.match(message if ".*" in message else re.escape(message), str(raised.value))
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("name", ["LambdaLR", "SequentialLR"])
def test_a_scheduler_a_table_cannot_hold_points_to_a_factory(name):
    with pytest.raises(ConfigError, match=f"train.scheduler.name: '{name}' cannot be used: .*give a function that "
                                          "builds it: train.scheduler.factory, or shoal.fit\\(scheduler=...\\)"):
        make_schedule({"name": name}, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0))


# ---------------------------------------------------------------- in a job


def test_the_launchers_check_calls_the_factory_on_the_jobs_optimizer(tmp_path):
    with pytest.raises(ConfigError, match="train.scheduler.factory: .*:failing' failed: KeyError"):
        prepare(job(tmp_path, scheduler={"factory": f"{HERE}:failing"}))
    config = job(tmp_path, scheduler={"factory": f"{HERE}:warm_then_cosine", "interval": "step"})
    config.algorithm.name, config.algorithm.options = "downpour", {}
    with pytest.raises(ConfigError, match="train.scheduler: downpour applies updates on its server"):
        prepare(config)


def test_a_job_resumed_mid_schedule_ends_with_the_weights_and_rate_of_an_uninterrupted_one(tmp_path):
    """Built by the function fit writes into each run directory: the runner reads it from its own."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    for run_dir in (whole, parts):
        run_dir.mkdir()
        save_object(by_epochs, run_dir / "train.scheduler.factory.pkl", "train.scheduler.factory")
    scheduler = {"factory": "train.scheduler.factory.pkl"}
    ended = Runner(job(tmp_path, scheduler=scheduler), DistInfo(), whole, threads=1, comm=Communicator(0, 1))
    ended.run()
    Runner(job(tmp_path, scheduler=scheduler, epochs=2), DistInfo(), parts, threads=1, comm=Communicator(0, 1)).run()
    resumed = Runner(job(tmp_path, scheduler=scheduler), DistInfo(), parts, threads=1, resume=True,
                     comm=Communicator(0, 1))
    resumed.run()
    plain = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.01)  # the tiny job's adam, lr 0.01
    reference = by_epochs(plain)
    for _ in range(3):
        plain.step()
        reference.step()
    assert resumed.optimizer.param_groups[0]["lr"] == ended.optimizer.param_groups[0]["lr"] == \
        plain.param_groups[0]["lr"]
    for name, tensor in weights(whole).items():
        assert torch.equal(tensor, weights(parts)[name]), name
