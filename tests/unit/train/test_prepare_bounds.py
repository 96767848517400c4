"""The launcher's check refuses what would fail in every worker: an optimizer shoal cannot drive,
and a model too large for this machine, found on torch's meta device before any memory is taken."""

from __future__ import annotations

import re
import sys
import uuid

import pytest
import torch

from shoal.errors import ConfigError
from shoal.jobs import from_dict
from shoal.model import build_model
from shoal.train.prepare import (
    TRAINING_COPIES,
    allocate_model,
    check_model_size,
    check_optimizer,
    estimate_model,
    make_optimizer,
    prepare,
    training_bytes,
)
from tests.distributed.common import FEATURES, write_dataset


def one_line(caught: pytest.ExceptionInfo) -> str:
    message = str(caught.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- optimizers shoal's loop cannot drive


@pytest.mark.parametrize(("name", "reason"), [
    ("lbfgs", "LBFGS needs a closure that recomputes the loss at every step"),
    ("LBFGS", "LBFGS needs a closure that recomputes the loss at every step"),
    ("sparseadam", "SparseAdam needs sparse gradients"),
])
def test_an_optimizer_shoal_cannot_drive_is_refused_by_name(name, reason):
    with pytest.raises(ConfigError) as caught:
        check_optimizer({"name": name, "lr": 0.1}, torch.nn.Linear(3, 2).parameters())
    assert one_line(caught).startswith(f"train.optimizer.name: {name!r} cannot be used: {reason}")


def test_the_workers_refuse_it_the_same_way():
    with pytest.raises(ConfigError, match=r"^train\.optimizer\.name: 'sparseadam' cannot be used"):
        make_optimizer({"name": "sparseadam"}, torch.nn.Linear(3, 2).parameters())


def test_a_misspelt_name_is_not_pointed_at_a_refused_optimizer():
    with pytest.raises(ConfigError) as caught:
        check_optimizer({"name": "lbfgss"}, torch.nn.Linear(3, 2).parameters())
    assert one_line(caught).startswith("train.optimizer.name: unknown optimizer 'lbfgss'")
    assert "did you mean 'lbfgs'" not in str(caught.value)


# ---------------------------------------------------------------- the model's size, on the meta device

EVERY_KIND = {
    "dense": ([10], [{"dense": 5, "activation": "relu", "bias": False}, {"dropout": 0.5}, {"dense": 2}]),
    "activation": ([10], [{"activation": "softmax"}, {"dense": 2}]),
    "image": ([8, 8], [{"conv2d": 4, "kernel": 3, "padding": 1, "stride": 1, "activation": "relu"},
                       {"maxpool": 2, "stride": 2}, {"batchnorm": True}, {"flatten": True}, {"batchnorm": True},
                       {"dense": 2}]),
    "sequence": ([16], [{"reshape": [4, 4]}, {"batchnorm": True}, {"lstm": 6, "layers": 2}, {"dense": 2}]),
}


@pytest.mark.parametrize("kind", list(EVERY_KIND))
def test_every_layer_kind_builds_on_the_meta_device_with_the_real_size(kind):
    shape, layers = EVERY_KIND[kind]
    spec = {"input": shape, "layers": layers}
    estimate = estimate_model(spec)
    assert all(p.is_meta for p in estimate.parameters())
    real = build_model(spec)
    assert [p.shape for p in estimate.parameters()] == [p.shape for p in real.parameters()]
    assert training_bytes(estimate) == training_bytes(real)


def test_a_model_larger_than_the_memory_available_is_refused_with_its_size():
    spec = {"input": [10], "layers": [{"dense": 1000}, {"dense": 2}]}
    parameters = 10 * 1000 + 1000 + 1000 * 2 + 2
    with pytest.raises(ConfigError) as caught:
        check_model_size(spec, available=parameters * 4 * TRAINING_COPIES - 1)
    assert one_line(caught) == (
        "model.layers: the model has 13,002 parameters and takes about 0.0 GiB to train (weights, gradients, "
        "optimizer state), more than the 0.0 GiB this machine has available")
    check_model_size(spec, available=parameters * 4 * TRAINING_COPIES)


def test_a_layer_past_torchs_limits_is_refused_as_too_large():
    with pytest.raises(ConfigError) as caught:
        check_model_size({"input": [10], "layers": [{"dense": 2**62}]})
    assert one_line(caught).startswith("model.layers: too large to build: ")


def test_running_out_of_memory_while_building_is_one_line_naming_the_layers():
    # 45 PB: past any machine's memory and address space, so the allocation fails at once
    with pytest.raises(ConfigError) as caught:
        allocate_model({"input": [10], "layers": [{"dense": 2**50}]})
    assert one_line(caught).startswith("model.layers: not enough memory to build the model: ")


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A module of model factories the job can name, under a fresh name."""
    name = f"factories_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(
        "import torch\n"
        "SCALE = torch.ones(3)  # made on import\n"
        "def huge():\n"
        "    return torch.nn.Linear(10, 100_000_000_000)\n"
        "def needs_values():\n"
        "    layer = torch.nn.Linear(10, 3)\n"
        "    assert layer.weight.abs().sum().item() >= 0  # no value on the meta device\n"
        "    return layer\n"
        "def scaled():\n"
        "    layer = torch.nn.Linear(10, 3)\n"
        "    layer.register_buffer('scale', SCALE)\n"
        "    return layer\n"
        "def exhausted():\n"
        "    raise MemoryError()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_factory_model_too_large_is_refused_naming_the_factory(factories):
    with pytest.raises(ConfigError) as caught:
        check_model_size({"input": [10], "factory": f"{factories}:huge", "arguments": {}})
    assert re.fullmatch(r"model\.factory: the model has 1,100,000,000,000 parameters and takes about [0-9,.]+ GiB "
                        r"to train .* more than the [0-9,.]+ GiB this machine has available", one_line(caught))


def test_a_factory_that_needs_real_tensors_is_left_to_its_real_build(factories):
    spec = {"input": [10], "factory": f"{factories}:needs_values", "arguments": {}}
    assert estimate_model(spec) is None
    check_model_size(spec)
    assert allocate_model(spec).weight.shape == (3, 10)


def test_tensors_a_factory_module_makes_on_import_stay_real(factories):
    spec = {"input": [10], "factory": f"{factories}:scaled", "arguments": {}}
    assert estimate_model(spec).weight.is_meta
    assert not sys.modules[factories].SCALE.is_meta
    assert not allocate_model(spec).scale.is_meta


def test_a_factory_out_of_memory_is_one_line_naming_the_factory(factories):
    with pytest.raises(ConfigError) as caught:
        allocate_model({"input": [10], "factory": f"{factories}:exhausted", "arguments": {}})
    assert one_line(caught).startswith("model.factory: ")


# ---------------------------------------------------------------- through prepare, as the launcher runs it


def test_prepare_refuses_a_huge_model_before_allocating_it(tmp_path):
    job = from_dict({
        "model": {"layers": [{"dense": 100_000_000_000}, {"dense": 3}]},
        "data": {"train": write_dataset(tmp_path / "train", rows=20)},
    })
    with pytest.raises(ConfigError) as caught:
        prepare(job)
    parameters = FEATURES * 10**11 + 10**11 + 10**11 * 3 + 3
    assert one_line(caught).startswith(f"model.layers: the model has {parameters:,} parameters and takes about ")


def test_a_worker_whose_launcher_checked_the_memory_skips_the_meta_build(tmp_path, monkeypatch):
    """The launcher on the worker's machine checked the model's memory before starting it; the meta build (half a
    second of imports) is not done again in every worker, while the other checks still run."""
    built = []
    monkeypatch.setattr("shoal.train.prepare.check_model_size", built.append)
    train = write_dataset(tmp_path / "train", rows=20)
    job = from_dict({"model": {"layers": [{"dense": 4}, {"dense": 3}]}, "data": {"train": train}})
    assert prepare(job, memory_checked=True).spec and not built
    prepare(job)
    assert len(built) == 1
    wrong = from_dict({"model": {"layers": [{"dense": 4}, {"dense": 7}]}, "data": {"train": train}})
    with pytest.raises(ConfigError, match=r"the model gives outputs of shape \[7\]"):  # 3 classes: still refused
        prepare(wrong, memory_checked=True)
