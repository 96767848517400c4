"""A worker defers torch's compiler for its life: training, checkpoints and a process group never import it,
and whatever needs it (torch.compile, a user's own `disable`, a submodule) gets the real one, with torch's marks
made again by it. Each case runs in a fresh interpreter: the stand-in lives in `sys.modules`."""

from __future__ import annotations

import subprocess
import sys

import pytest

TRAINING = """
import io, sys, tempfile
import torch, torch.distributed as dist
from shoal.train.uncompiled import CACHED, DeferredCompiler, defer_compiler
defer_compiler()
store = dist.FileStore(tempfile.mktemp(), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
for _ in range(3):
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(torch.randn(16, 4)), torch.randint(0, 2, (16,))).backward()
    dist.all_reduce(model[0].weight.grad)
    optimizer.step()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, io.BytesIO())
with torch.device("meta"):
    assert torch.nn.Linear(3, 2)(torch.zeros(2, 3)).shape == (2, 2)
assert isinstance(sys.modules["torch._dynamo"], DeferredCompiler), "training imported torch's compiler"
zero_grad = torch.optim.Optimizer.zero_grad.__wrapped__
assert getattr(zero_grad, CACHED) is zero_grad  # marked by the stand-in: the function as it is
dist.destroy_process_group()
"""

NEEDS = {
    "compile": """
compiled = torch.compile(lambda x: torch.sin(x) + 1, backend="eager")
assert torch.allclose(compiled(torch.zeros(3)), torch.ones(3))
""",
    "a user's disable": """
def own(x):
    return x + 1
assert torch.compiler.disable(own) is not own
""",
    "a submodule": """
import torch._dynamo.config
assert torch._dynamo.config.cache_size_limit > 0
""",
}

AFTER = """
assert not isinstance(sys.modules["torch._dynamo"], DeferredCompiler) and hasattr(torch._dynamo, "optimize")
assert not hasattr(zero_grad, CACHED), "a mark the stand-in handed out was kept"
optimizer.zero_grad()  # torch marks it again, now with the real compiler
assert getattr(zero_grad, CACHED) is not zero_grad
"""


def run(script: str, env: dict) -> None:
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert finished.returncode == 0, finished.stderr[-3000:]


def test_training_never_imports_the_compiler(project_env):
    run(TRAINING, project_env)


@pytest.mark.parametrize("need", list(NEEDS))
def test_what_needs_the_compiler_gets_the_real_one_and_torch_marks_again_with_it(need, project_env):
    run(TRAINING + NEEDS[need] + AFTER, project_env)
