"""The launcher's checks of the model and the optimizer leave torch's compiler unimported, each case in a fresh
interpreter (the stand-in lives in `sys.modules`)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys, torch
from shoal.train.prepare import check_model_size, check_optimizer
from shoal.train.uncompiled import CACHED
check_optimizer({"name": "adam", "lr": 0.01}, torch.nn.Linear(3, 2).parameters())
check_model_size({"input": [2, 12, 12], "layers": [
    {"conv2d": 4, "kernel": 3, "activation": "relu"}, {"maxpool": 2}, {"batchnorm": True}, {"dropout": 0.1},
    {"reshape": [4, 25]}, {"lstm": 8, "layers": 2}, {"dense": 3, "activation": "tanh"}]})
assert "torch._dynamo" not in sys.modules, "a check imported torch's compiler"
assert not hasattr(torch.optim.Optimizer.add_param_group.__wrapped__, CACHED), "a mark was left behind"
torch.optim.Adam(torch.nn.Linear(3, 2).parameters())  # a real optimizer still goes through torch's wrapper
assert "torch._dynamo" in sys.modules
with torch.device("meta"):  # and so do the meta kernels, with the real compiler
    assert torch.nn.Linear(3, 2)(torch.zeros(2, 3)).shape == (2, 2)
"""


def test_the_checks_leave_torchs_compiler_unimported_and_its_marks_as_they_were(project_env):
    finished = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=project_env,
                              timeout=60)
    assert finished.returncode == 0, finished.stderr


def test_work_that_needs_more_of_the_compiler_gets_the_real_one_there_and_then(project_env):
    script = """
import sys, torch
from shoal.train.uncompiled import without_compiler
calls = []
def work():
    calls.append(1)
    import torch._dynamo
    return torch._dynamo.is_compiling()
assert without_compiler(work) is False and len(calls) == 1, calls
assert "torch._dynamo" in sys.modules and hasattr(sys.modules["torch._dynamo"], "optimize")
"""
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=project_env,
                              timeout=60)
    assert finished.returncode == 0, finished.stderr
