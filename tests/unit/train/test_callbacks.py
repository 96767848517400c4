"""The user's callbacks: on_epoch_end with or without the model, on_step, on_train_end, and their failures.

A job runs in process (a world of one, and a server job on fake ranks) so the hooks are called where
`python -m shoal.worker` calls them, with the model shoal saves.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn

from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.cluster.fake import run_ranks
from shoal.errors import ConfigError, ShoalError
from shoal.fit_inputs import CALLBACKS_FILE, ship_callbacks
from shoal.jobs import from_dict
from shoal.run.artifacts import load_model
from shoal.train.runner import Runner
from shoal.train.stopping import Callbacks, Stopping
from tests.distributed.common import write_dataset


class Watcher:
    """Every hook, recording what it was given."""

    def __init__(self):
        self.steps, self.epochs, self.ends = [], [], []

    def on_step(self, step, loss):
        self.steps.append((step, loss))

    def on_epoch_end(self, epoch, metrics, model):
        self.epochs.append((epoch, metrics, model.training, torch.is_grad_enabled(),
                            copy.deepcopy(model.state_dict())))

    def on_train_end(self, metrics, model):
        self.ends.append((metrics, model.training, copy.deepcopy(model.state_dict())))


class TwoArguments:
    def __init__(self):
        self.epochs = []

    def on_epoch_end(self, epoch, metrics):
        self.epochs.append(epoch)
        return epoch == 1


def lender(model: nn.Module, entered: list):
    @contextlib.contextmanager
    def consensus():
        entered.append(1)
        yield model

    return consensus


def test_on_epoch_end_gets_the_lent_model_in_eval_mode_only_when_it_takes_one():
    model, entered = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)), []
    watcher, plain = Watcher(), TwoArguments()
    stopping = Stopping(None, [watcher, plain])
    assert stopping.decide(0, {"train_loss": 0.5}, lender(model, entered)) is None
    assert "TwoArguments" in stopping.decide(1, {"train_loss": 0.4}, lender(model, entered))
    assert entered == [1, 1]  # the consensus lent once an epoch
    assert [(epoch, metrics, training, grad) for epoch, metrics, training, grad, _ in watcher.epochs] == [
        (0, {"train_loss": 0.5}, False, False), (1, {"train_loss": 0.4}, False, False)]
    assert model.training  # given back in train mode
    assert plain.epochs == [0, 1]
    alone, entered = Stopping(None, [TwoArguments()]), []
    alone.decide(0, {}, lender(model, entered))
    assert entered == []  # no callback takes the model: no consensus to make


@pytest.mark.parametrize("hook", ["on_epoch_end", "on_step", "on_train_end"])
def test_a_failing_callback_is_one_line_naming_its_class_and_hook(hook):
    class Faulty:
        def on_epoch_end(self, epoch, metrics):
            raise RuntimeError("disk full\nsecond line")

        on_step = on_epoch_end

        def on_train_end(self, metrics, model):
            raise RuntimeError("disk full\nsecond line")

    callbacks = Callbacks([Faulty()])
    calls = {"on_epoch_end": lambda: Stopping(None, callbacks).decide(0, {}),
             "on_step": lambda: callbacks.step(1, 0.5),
             "on_train_end": lambda: callbacks.train_end({}, nn.Linear(1, 1))}
    with pytest.raises(ShoalError) as raised:
        calls[hook]()
    assert str(raised.value) == f"callbacks: Faulty.{hook}: RuntimeError: disk full"


def test_every_hook_is_optional_but_a_callback_has_one(tmp_path):
    class OnlySteps:
        def on_step(self, step, loss):
            pass

    with pytest.raises(ConfigError, match=r"^callbacks: object has no on_epoch_end\(epoch, metrics\[, model\]\), "
                                          r"on_step\(step, loss\) nor on_train_end\(metrics, model\) method$"):
        ship_callbacks([OnlySteps(), object()], tmp_path)
    assert ship_callbacks([OnlySteps()], tmp_path) == tmp_path / CALLBACKS_FILE
    Stopping(None, [OnlySteps()]).decide(0, {})  # no on_epoch_end: nothing to call
    Callbacks([OnlySteps()]).train_end({}, nn.Linear(1, 1))


def job(tmp_path, **train):
    train_set, test_set = str(tmp_path / "train"), str(tmp_path / "test")
    write_dataset(train_set, rows=96, seed=1)
    write_dataset(test_set, rows=30, seed=2)
    return from_dict({
        "model": {"layers": [{"dense": 8, "activation": "tanh"}, {"dropout": 0.2}, {"dense": 3}]},
        "data": {"train": train_set, "test": test_set},
        "train": {"epochs": 2, "batch_size": 8, "optimizer": {"name": "adam", "lr": 0.01}, **train},
        "output": {"progress": "none"},
    }, name="tiny")


def test_a_job_calls_on_step_every_step_and_on_train_end_once_with_the_saved_model(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    watcher = Watcher()
    runner = Runner(job(tmp_path), DistInfo(), run_dir, threads=1, comm=Communicator(0, 1), callbacks=[watcher])
    final = runner.run()
    steps = 2 * 96 // 8
    assert [step for step, _ in watcher.steps] == list(range(1, steps + 1))
    assert all(isinstance(loss, float) and loss > 0 for _, loss in watcher.steps)
    assert [epoch for epoch, *_ in watcher.epochs] == [0, 1]
    assert all(not training and not grad for _, _, training, grad, _ in watcher.epochs)
    assert len(watcher.ends) == 1
    metrics, training, weights = watcher.ends[0]
    assert not training and runner.model.training  # eval for the callback, train mode again after
    assert metrics == {"train_loss": pytest.approx(watcher.epochs[-1][1]["train_loss"]),
                       **{f"test_{name}": value for name, value in final.items()}}
    saved = load_model(run_dir).state_dict()
    assert saved.keys() == weights.keys()
    for name, tensor in saved.items():
        assert torch.equal(tensor, weights[name]), name
        assert torch.equal(tensor, watcher.epochs[-1][4][name]), name  # the last epoch's model is the one saved


def test_a_serving_rank_0_takes_no_steps_but_hears_of_epochs_and_the_end(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = job(tmp_path)
    config.algorithm.name, config.algorithm.options = "downpour", {"sync_every": 2}
    watcher = Watcher()

    def rank(comm):
        info = DistInfo(rank=comm.rank, world_size=comm.world_size, host="host-a")
        return Runner(config, info, run_dir, threads=1, comm=comm, callbacks=[watcher]).run()

    run_ranks(3, rank, timeout=30)
    assert watcher.steps == []  # rank 0 is the server: the trainers' steps are not its
    assert [epoch for epoch, *_ in watcher.epochs] == [0, 1]
    assert len(watcher.ends) == 1
    for name, tensor in load_model(run_dir).state_dict().items():
        assert torch.equal(tensor, watcher.ends[0][2][name]), name
