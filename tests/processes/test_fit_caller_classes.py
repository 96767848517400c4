"""`shoal.fit` leaves the caller's classes as they were.

fit writes the model by value, and its own process reads that file again (the launcher's checks, the model it
returns). Unpickled there, cloudpickle would hand the caller's class, which it finds defined already, the
methods of the file's copy: code of no file, globals frozen as they were when fit wrote it. So fit's process
reads the file as the caller's object (shoal.in_process.read_as_given)."""

from __future__ import annotations

import sys

import numpy as np
import torch
from torch import nn

import shoal

SCALE = 1.0
"""Read by Scaled.forward at every call, from this module."""


class Scaled(nn.Module):
    """A class of the user's own module: written by value (a worker may not import it)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, inputs):
        return SCALE * self.layer(inputs)


def test_a_fit_leaves_the_model_s_class_with_its_own_methods_and_globals(tmp_path, monkeypatch):
    features = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int64)
    forward = Scaled.forward
    result = shoal.fit(model=Scaled(), train=(features, labels), workers=1, epochs=1, batch_size=64,
                       run_dir=tmp_path / "run", output={"progress": "none"}, checkpoint={"every": 0})
    assert Scaled.forward is forward  # not the copy's
    assert type(result.model) is Scaled and result.model.training is False
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 0.0)  # the module's globals, as the caller changes them
    assert torch.equal(result.model(torch.ones(3, 4)).abs(), torch.zeros(3, 2))


def data() -> tuple[np.ndarray, np.ndarray]:
    features = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    return features, (features[:, 0] > 0).astype(np.int64)


def test_a_model_function_s_module_is_never_the_one_trained(tmp_path):
    """A function returning the caller's own module (a cached or pretrained one): each fit trains a copy, so the
    caller's module keeps its weights, and a second fit starts where the first did, not where it ended."""
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    before = {name: value.clone() for name, value in net.state_dict().items()}
    results = [shoal.fit(model=lambda: net, train=data(), workers=workers, epochs=1, batch_size=64,
                         run_dir=tmp_path / f"run-{workers}", output={"progress": "none"}, checkpoint={"every": 0})
               for workers in (1, 0)]
    assert all(torch.equal(net.state_dict()[name], value) for name, value in before.items())
    assert all(result.model is not net for result in results)
    assert not torch.equal(results[0].model.weight, net.weight)  # trained, on a copy


def test_a_model_that_cannot_be_deep_copied_trains_from_its_file(tmp_path):
    """weight_norm's module holds a tensor computed from others: deepcopy refuses it, pickling takes it."""
    model = torch.nn.utils.weight_norm(nn.Linear(4, 2))
    result = shoal.fit(model=model, train=data(), workers=1, epochs=1, batch_size=64, run_dir=tmp_path / "run",
                       output={"progress": "none"}, checkpoint={"every": 0})
    assert result.model is not model and result.model(torch.ones(3, 4)).shape == (3, 2)
