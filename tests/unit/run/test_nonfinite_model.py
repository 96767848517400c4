"""model.pt is never written from weights that are not finite without saying so (checkpoint.allow_nonfinite)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shoal.config import CheckpointConfig
from shoal.errors import ConfigError, ShoalError
from shoal.jobs import from_dict
from shoal.run.artifacts import MODEL_FILE, load_artifact, save_model

SPEC = {"input": [3], "layers": [{"dense": 2}]}


def save(run_dir, model: nn.Module, **options):
    return save_model(run_dir, model, SPEC, "cross_entropy", ["a", "b"], "float32", **options)


def with_nan() -> nn.Module:
    model = nn.Sequential(nn.Linear(3, 2))
    with torch.no_grad():
        model[0].bias[1] = float("nan")
    return model


def test_weights_that_are_not_finite_stop_in_one_line_with_nothing_written(tmp_path):
    with pytest.raises(ShoalError) as caught:
        save(tmp_path, with_nan())
    assert str(caught.value) == (f"{tmp_path}: model.pt not written: the trained weight '0.bias' holds 1 non-finite "
                                 "value (of 2); set checkpoint.allow_nonfinite = true to write it all the same")
    assert caught.value.exit_code == 2
    assert list(tmp_path.iterdir()) == []


def test_asked_for_they_are_written_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match=r"model\.pt written with weights that are not finite: the trained weight "
                                         r"'0\.bias' holds 1 non-finite value"):
        save(tmp_path, with_nan(), allow_nonfinite=True)
    assert torch.isnan(load_artifact(tmp_path)["state_dict"]["0.bias"][1])


def test_an_infinite_buffer_is_written_without_a_word(tmp_path, recwarn):
    model = nn.Sequential(nn.Linear(3, 2))
    model.register_buffer("mask", torch.tensor([float("-inf"), 0.0]))
    save(tmp_path, model)
    assert (tmp_path / MODEL_FILE).exists() and not recwarn.list


def test_the_option_is_a_boolean_off_by_default():
    assert CheckpointConfig().allow_nonfinite is False
    raw = {"model": {"layers": [{"dense": 2}]}, "data": {"train": "/nowhere"}}
    assert from_dict({**raw, "checkpoint": {"allow_nonfinite": True}}).checkpoint.allow_nonfinite is True
    with pytest.raises(ConfigError, match=r"^checkpoint\.allow_nonfinite: expected bool, got 'yes'$"):
        from_dict({**raw, "checkpoint": {"allow_nonfinite": "yes"}})
