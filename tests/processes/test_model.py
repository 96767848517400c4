"""Sizing a model on the meta device, in a fresh interpreter: what it leaves unimported."""

from __future__ import annotations

import subprocess
import sys


def test_sizing_a_dense_model_on_the_meta_device_imports_no_sympy(project_env):
    script = """
import sys
from shoal.train.prepare import built_on_meta
model = built_on_meta({"input": [784], "layers": [{"dense": 256, "activation": "relu"}, {"dropout": 0.1},
                                                  {"dense": 10}]})
assert next(model.parameters()).is_meta and "sympy" not in sys.modules, "sympy imported"
"""
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=project_env,
                              timeout=120)
    assert finished.returncode == 0, finished.stderr[-2000:]
