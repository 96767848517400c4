"""A transform or step that reshapes the batch so that the model refuses it is one line naming which, the shape it
made and the shape the model takes; a model that takes the new shape trains, and one that refuses both keeps
torch's own error. A model shoal.fit shipped is named as fit's argument, `model`."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional

from shoal.algorithms import make_algorithm
from shoal.cluster.collectives import Communicator
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.errors import ConfigError, UserCodeError
from shoal.model import from_object
from shoal.objects import save_object
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from shoal.train.prepare import model_key
from shoal.train.step import Step
from shoal.train.transform import Transform
from tests.distributed.common import CLASSES, FEATURES, write_dataset

BATCH = 16
KEPT = 4  # the features a cropping transform keeps, of FEATURES


def crop(batch):
    inputs, labels = batch
    return inputs[:, :KEPT], labels


def feeding_a_crop(model, batch):
    inputs, labels = batch
    return functional.cross_entropy(model(inputs[:, :KEPT]), labels)


def a_trainer(tmp_path, model, *, step=None, transform=None) -> Trainer:
    dataset = open_dataset(write_dataset(tmp_path / "data", rows=48))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    comm = Communicator(0, 1)
    algorithm = make_algorithm("sync", {})
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(dataset, rank=0, world_size=1, batch_size=BATCH, seed=4)
    return Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm,
                   step=step and Step(step), transform=transform and Transform(transform, seed=0, trainer=0))


def test_a_transform_whose_crop_the_model_refuses_is_named_with_both_shapes(tmp_path):
    trainer = a_trainer(tmp_path, nn.Linear(FEATURES, CLASSES), transform=crop)
    with pytest.raises(ConfigError) as raised:
        trainer.train_epoch(0)
    assert str(raised.value) == (f"data.transform: returned inputs of shape [{BATCH}, {KEPT}]; the model takes "
                                 f"[{BATCH}, {FEATURES}] (the batch's shape before the transform)")
    assert isinstance(raised.value.__cause__, RuntimeError)  # torch's error, kept as the cause


def test_a_step_feeding_the_model_another_shape_is_named(tmp_path):
    trainer = a_trainer(tmp_path, nn.Linear(FEATURES, CLASSES), step=feeding_a_crop)
    with pytest.raises(ConfigError) as raised:
        trainer.train_epoch(0)
    assert str(raised.value) == (f"train.step: gave the model inputs of shape [{BATCH}, {KEPT}]; the model takes "
                                 f"[{BATCH}, {FEATURES}] (the batch's shape)")
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_a_model_that_takes_the_crop_trains_and_is_left_without_hooks(tmp_path):
    model = nn.Linear(KEPT, CLASSES)
    trainer = a_trainer(tmp_path, model, transform=crop)
    for epoch in range(2):
        assert trainer.train_epoch(epoch).rows == 48
    assert not model._forward_pre_hooks and not model._forward_hooks  # checked on the first batch only


@pytest.mark.parametrize("transform", [crop, lambda batch: batch])
def test_a_model_that_refuses_the_data_s_own_shape_too_keeps_torch_s_error(tmp_path, transform):
    trainer = a_trainer(tmp_path, nn.Linear(FEATURES - 1, CLASSES), transform=transform)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        trainer.train_epoch(0)


def test_a_step_s_own_error_after_the_model_ran_is_still_the_step_s(tmp_path):
    def failing(model, batch):
        model(batch[0][:, :KEPT])
        raise RuntimeError("the step's own failure")

    trainer = a_trainer(tmp_path, nn.Linear(KEPT, CLASSES), step=failing)
    with pytest.raises(UserCodeError, match=r"^train\.step: RuntimeError: the step's own failure$"):
        trainer.train_epoch(0)


def test_a_model_fit_shipped_is_named_as_fit_s_argument_and_a_job_s_as_its_key(tmp_path):
    assert model_key({"input": [3], "object": "model.object.pkl"}) == "model"
    assert model_key({"input": [3], "object": "mine.pkl"}) == "model.object"
    assert model_key({"input": [3], "factory": "package.module:function"}) == "model.factory"


def broken():
    raise ValueError("no weights")


def test_a_failing_callable_fit_shipped_is_named_as_fit_s_argument(tmp_path):
    for name, key in (("model.object.pkl", "model"), ("mine.pkl", "model.object")):
        save_object(broken, tmp_path / name, "model")
        with pytest.raises(ConfigError, match=rf"^{key}: the model's callable failed: ValueError: no weights$"):
            from_object(name, tmp_path)


def test_a_model_that_takes_no_hooks_trains_unchecked(tmp_path):
    """A TorchScript module refuses forward hooks: the first batch is trained without the shape check, not failed."""
    scripted = torch.jit.script(nn.Sequential(nn.Linear(KEPT, CLASSES)))
    trainer = a_trainer(tmp_path, scripted, transform=crop)
    stats = trainer.train_epoch(0)
    assert stats.steps == 3 and stats.rows == 48
