"""The launcher's check of the optimizer: the same errors as building it, without importing torch's compiler."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from shoal.errors import ConfigError
from shoal.train.prepare import check_optimizer

CHECK = """
import sys, torch
from shoal.train.prepare import check_optimizer
check_optimizer({"name": "adam", "lr": 0.01}, torch.nn.Linear(3, 2).parameters())
assert "torch._dynamo" not in sys.modules, "the check imported torch's compiler"
torch.optim.Adam(torch.nn.Linear(3, 2).parameters())  # a real optimizer still goes through torch's wrapper
assert "torch._dynamo" in sys.modules
"""


def test_the_check_leaves_torchs_compiler_unimported_and_its_wrapper_as_it_was(project_env):
    finished = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=project_env,
                              timeout=60)
    assert finished.returncode == 0, finished.stderr


@pytest.mark.parametrize(("options", "culprit"), [
    ({"name": "adam", "lr": -1.0}, "train.optimizer: Invalid learning rate: -1.0"),
    ({"name": "sgd", "lr": 0.1, "betas": (0.9, 0.99)}, "train.optimizer.betas: not an argument of torch.optim.SGD"),
    ({"name": "adamm"}, "did you mean 'adam'?"),
])
def test_bad_settings_are_config_errors_naming_the_key(options, culprit):
    with pytest.raises(ConfigError, match=re.escape(culprit)):
        check_optimizer(options, torch.nn.Linear(3, 2).parameters())
