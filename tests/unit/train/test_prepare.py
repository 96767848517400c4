"""The launcher's checks of the optimizer: the same errors as building it. That the checks leave torch's compiler
unimported is checked in fresh interpreters: tests/processes/train/test_prepare.py."""

from __future__ import annotations

import re

import pytest
import torch

from shoal.errors import ConfigError
from shoal.train.prepare import check_optimizer


@pytest.mark.parametrize(("options", "culprit"), [
    ({"name": "adam", "lr": -1.0}, "train.optimizer: Invalid learning rate: -1.0"),
    ({"name": "sgd", "lr": 0.1, "betas": (0.9, 0.99)}, "train.optimizer.betas: not an argument of torch.optim.SGD"),
    ({"name": "adamm"}, "did you mean 'adam'?"),
])
def test_bad_settings_are_config_errors_naming_the_key(options, culprit):
    with pytest.raises(ConfigError, match=re.escape(culprit)):
        check_optimizer(options, torch.nn.Linear(3, 2).parameters())
