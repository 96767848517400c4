"""train.scheduler and train.clip_norm in the runner: the rates torch's own loop gives, a bit-identical
resume mid-schedule (with accumulation, bf16 and a patience count too), clipping, and one-line errors."""

from __future__ import annotations

import pytest
import torch

from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.errors import ConfigError
from shoal.train.prepare import prepare
from shoal.train.runner import Runner
from tests.unit.train.test_runner import job, weights

SGD = {"name": "sgd", "lr": 0.1, "momentum": 0.9}


def rates_by_epoch(tmp_path, **train) -> tuple[list[float], int]:
    """The learning rate after each epoch of the tiny job, run step by step; and its steps per epoch."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runner = Runner(job(tmp_path, optimizer=SGD, **train), DistInfo(), run_dir, threads=1, comm=Communicator(0, 1))
    rates = []
    try:
        runner.setup()
        runner.load_data()
        runner.resume()
        runner.start()
        for epoch in range(3):
            runner.end_epoch(epoch, runner.run_epoch(epoch))
            rates.append(runner.optimizer.param_groups[0]["lr"])
        runner.complete()
    finally:
        runner.finish()
    return rates, runner.steps


def torch_rates(name: str, arguments: dict, steps: int, per_step: bool) -> list[float]:
    """The same scheduler in a plain torch loop: the rate after each epoch of `steps` steps."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=SGD["lr"], momentum=0.9)
    scheduler = getattr(torch.optim.lr_scheduler, name)(optimizer, **arguments)
    rates = []
    for _ in range(3):
        for _ in range(steps):
            optimizer.step()
            if per_step:
                scheduler.step()
        if not per_step:
            scheduler.step()
        rates.append(optimizer.param_groups[0]["lr"])
    return rates


@pytest.mark.parametrize("name, arguments, per_step", [
    ("StepLR", {"step_size": 1, "gamma": 0.5}, False),
    ("CosineAnnealingLR", {"T_max": 3}, False),
    ("OneCycleLR", {"max_lr": 0.5, "total_steps": 36}, True),
])
def test_a_scheduler_sets_the_rates_torch_does(tmp_path, name, arguments, per_step):
    rates, steps = rates_by_epoch(tmp_path, scheduler={"name": name, **arguments})
    assert steps == 12  # 96 rows, batch 8: OneCycleLR's 36 steps are the job's
    assert rates == torch_rates(name, arguments, steps, per_step)


@pytest.mark.parametrize("schedule", [
    {"scheduler": {"name": "OneCycleLR", "max_lr": 0.05, "total_steps": 36}, "clip_norm": 0.5},
    {"scheduler": {"name": "ReduceLROnPlateau", "patience": 0, "factor": 0.5}, "accumulate": 5},
    {"precision": "bf16", "accumulate": "epoch", "stop": {"metric": "test_loss", "patience": 5}},
], ids=["one-cycle-clipped", "plateau-accumulated", "bf16-batch-mode-patience"])
def test_a_resume_mid_schedule_ends_with_the_weights_of_an_uninterrupted_job(tmp_path, schedule):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir()
    parts.mkdir()
    Runner(job(tmp_path, **schedule), DistInfo(), whole, threads=1, comm=Communicator(0, 1)).run()
    Runner(job(tmp_path, epochs=2, **schedule), DistInfo(), parts, threads=1, comm=Communicator(0, 1)).run()
    Runner(job(tmp_path, **schedule), DistInfo(), parts, threads=1, resume=True, comm=Communicator(0, 1)).run()
    for name, tensor in weights(whole).items():
        assert torch.equal(tensor, weights(parts)[name]), name


def test_clipping_bounds_each_step(tmp_path):
    free, clipped = tmp_path / "free", tmp_path / "clipped"
    free.mkdir()
    clipped.mkdir()
    settings = {"optimizer": {"name": "sgd", "lr": 0.1}, "epochs": 1}
    runner = Runner(job(tmp_path, **settings, clip_norm=1e-6), DistInfo(), clipped, threads=1,
                    comm=Communicator(0, 1))
    runner.run()
    Runner(job(tmp_path, **settings), DistInfo(), free, threads=1, comm=Communicator(0, 1)).run()
    start = Runner(job(tmp_path, **settings), DistInfo(), tmp_path, threads=1, comm=Communicator(0, 1))
    start.setup()  # the seeded initial weights
    # on the device the runner chose (a GPU where there is one); the saved weights load on the CPU
    initial = {name: tensor.detach().cpu() for name, tensor in start.model.state_dict().items()}
    moved = {name: (weights(run)[name] - initial[name]).norm().item() for run in (free, clipped) for name in initial}
    steps = 12
    for name in initial:
        assert (weights(clipped)[name] - initial[name]).norm() <= steps * 0.1 * 1e-6 * 1.01  # each step <= lr x 1e-6
        assert (weights(free)[name] - initial[name]).norm() > 1e-3
    assert moved


@pytest.mark.parametrize("train, algorithm, message", [
    ({"scheduler": {"name": "StepLr", "step_size": 1}}, "sync", "unknown scheduler 'StepLr' \\(did you mean 'StepLR'"),
    ({"scheduler": {"name": "StepLR", "stepsize": 1}}, "sync", "train.scheduler.stepsize: not an argument"),
    ({"scheduler": {"name": "LambdaLR"}}, "sync", "takes a Python function"),
    ({"scheduler": {"name": "StepLR", "step_size": 1, "interval": "batch"}}, "sync", "train.scheduler.interval"),
    ({"scheduler": {"name": "ReduceLROnPlateau", "interval": "step"}}, "sync", "train.scheduler.interval: "
                                                                             "ReduceLROnPlateau steps on the epoch's"),
    ({"scheduler": {"name": "SequentialLR"}}, "sync", "give a function that builds it: train.scheduler.factory"),
    ({"scheduler": {"name": "OneCycleLR", "max_lr": 0.1, "total_steps": 9}}, "downpour", "per epoch"),
    ({"clip_norm": 1.0}, "downpour", "train.clip_norm: downpour sends"),
])
def test_bad_loop_settings_are_one_line_before_any_worker(tmp_path, train, algorithm, message):
    config = job(tmp_path, **train)
    config.algorithm.name, config.algorithm.options = algorithm, {}
    with pytest.raises(ConfigError, match=message) as raised:
        prepare(config)
    assert "\n" not in str(raised.value)


def test_clip_norm_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="train.clip_norm: must be a number > 0"):
        job(tmp_path, clip_norm=0.0)
