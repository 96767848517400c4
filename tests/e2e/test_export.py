"""`shoal export`: TorchScript, ONNX and safetensors files give the trained model's outputs, and load
without shoal; what it refuses is one line with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnxruntime
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import shoal
from shoal.cli import main
from shoal.data.format import open_dataset
from tests.e2e.jobs import train_small

TIMEOUT = 120


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir, test = train_small(tmp_path_factory.mktemp("export"))
    rows, _ = open_dataset(str(test)).read_all()
    with torch.no_grad():
        expected = shoal.load_model(run_dir)(torch.from_numpy(rows[:50])).numpy()
    return run_dir, rows[:50], expected


def shoal_export(run_dir, *arguments, env=None):
    return subprocess.run([sys.executable, "-m", "shoal", "export", str(run_dir), *map(str, arguments)],
                          capture_output=True, text=True, env=env, timeout=TIMEOUT)


def export_here(run_dir, *arguments) -> int:
    """`shoal export` in this process (its exit status): the command's own code without a new interpreter."""
    return main(["export", str(run_dir), *map(str, arguments)])


def test_torchscript_loads_in_plain_torch_without_shoal(trained, tmp_path, project_env):
    run_dir, rows, expected = trained
    out = tmp_path / "model.pt"
    finished = shoal_export(run_dir, "--format", "torchscript", "--out", out, env=project_env)
    assert finished.returncode == 0, finished.stderr
    np.save(tmp_path / "rows.npy", rows)
    # shoal made unimportable: the file needs torch alone
    script = ("import sys; sys.modules['shoal'] = None; import numpy, torch; "
              f"model = torch.jit.load({str(out)!r}); "
              f"print(model(torch.from_numpy(numpy.load({str(tmp_path / 'rows.npy')!r}))).tolist())")
    loaded = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=TIMEOUT)
    assert loaded.returncode == 0, loaded.stderr
    assert np.allclose(np.array(json.loads(loaded.stdout)), expected, atol=1e-5)


def test_onnx_runs_in_onnxruntime_with_any_batch(trained, tmp_path):
    run_dir, rows, expected = trained
    out = tmp_path / "model.onnx"
    assert export_here(run_dir, "--format", "onnx", "--out", out) == 0
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for count in (1, 50):  # a dynamic batch dimension
        (outputs,) = session.run(None, {"rows": rows[:count]})
        assert np.allclose(outputs, expected[:count], atol=1e-5)


def test_safetensors_holds_the_weights_and_the_spec(trained, tmp_path):
    run_dir, _, _ = trained
    out = tmp_path / "model.safetensors"
    assert export_here(run_dir, "--format", "safetensors", "--out", out) == 0
    weights = load_file(str(out))
    for name, tensor in shoal.load_model(run_dir).state_dict().items():
        assert torch.equal(weights[name], tensor), name
    with safe_open(str(out), "pt") as handle:
        metadata = handle.metadata()
    assert json.loads(metadata["shoal.spec"])["layers"][0] == {"dense": 16, "activation": "relu"}
    assert json.loads(metadata["shoal.classes"]) == ["no", "yes"]


@pytest.mark.parametrize("arguments, message", [
    (["--format", "pickle"], "--format: must be one of torchscript, onnx, safetensors, got 'pickle'"),
    (["--format", "onnx", "--out", "RUN/model.onnx"], "inside the run directory"),
])
def test_refusals_are_one_line_with_status_2(trained, tmp_path, capsys, arguments, message):
    run_dir, _, _ = trained
    arguments = [str(argument).replace("RUN", str(run_dir)) for argument in arguments]
    assert export_here(run_dir, *arguments) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1


def test_a_missing_run_is_one_line(tmp_path, capsys):
    assert export_here(tmp_path / "nowhere", "--format", "torchscript", "--out", tmp_path / "m.pt") == 2
    assert "no trained model" in capsys.readouterr().err
    assert not (tmp_path / "m.pt").exists()


def test_a_missing_extra_names_the_pip_command(trained, tmp_path, capsys, monkeypatch):
    run_dir, _, _ = trained
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if not installed
    assert export_here(run_dir, "--format", "onnx", "--out", tmp_path / "m.onnx") == 2
    assert capsys.readouterr().err.strip() == ("shoal: error: --format onnx: needs the onnx package: "
                                               "pip install 'shoal[onnx]'")
