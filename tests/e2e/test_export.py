"""`shoal export`: TorchScript, ONNX and safetensors files give the trained model's outputs, and load
without shoal; what it refuses is one line with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnxruntime
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

import shoal
from shoal.cli import main
from shoal.data.format import open_dataset
from tests.e2e.jobs import FEATURES, write_task

TIMEOUT = 120


@pytest.fixture(scope="module")
def trained(small_run):
    run_dir, test = small_run
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


class Branchy(nn.Module):
    """A forward that decides on its input's values: a trace would keep one branch (the issue's diff 1.43)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(FEATURES, 2), nn.Linear(FEATURES, 2)

    def forward(self, x):
        if x[:, 0].mean() > 0:
            return self.a(x)
        return self.b(x) * 2 + 1


@pytest.fixture(scope="module")
def branchy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("branchy")
    train, test = write_task(folder, rows=400, test_rows=100)
    torch.manual_seed(0)
    return shoal.fit(model=Branchy(), train=str(train), test=str(test), workers=1, epochs=1,
                     output={"progress": "none"}, checkpoint={"every": 0}, run_dir=folder / "run").run_dir


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("format", ["torchscript", "onnx"])
def test_a_model_branching_on_its_input_is_refused_and_nothing_is_written(branchy, tmp_path, capsys, format):
    out = tmp_path / f"model.{format}"
    assert export_here(branchy, "--format", format, "--out", out, "--trust-code") == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1, error
    assert f"{out}: not exported as {format}: the model's forward branches on its input's values" in error
    assert "(in forward)" in error  # a model shipped by value: no file to name
    assert list(tmp_path.iterdir()) == []  # no file, no temporary


@pytest.mark.timeout(TIMEOUT)
def test_a_link_at_the_old_temporary_name_is_never_followed(trained, tmp_path):
    run_dir, rows, expected = trained
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    out = tmp_path / "model.pt"
    (tmp_path / ".model.pt.tmp").symlink_to(victim)  # the name export used to write through
    assert export_here(run_dir, "--format", "torchscript", "--out", out) == 0
    assert victim.read_text() == "keep me" and (tmp_path / ".model.pt.tmp").is_symlink()
    assert np.allclose(torch.jit.load(str(out))(torch.from_numpy(rows)).detach().numpy(), expected, atol=1e-5)
    assert sorted(path.name for path in tmp_path.iterdir()) == [".model.pt.tmp", "model.pt", "victim"]


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_every_format_gets_the_mode_of_a_new_file(trained, tmp_path, umask):
    run_dir, _, _ = trained
    previous = os.umask(umask)
    try:
        for format, extension in (("torchscript", "pt"), ("onnx", "onnx"), ("safetensors", "safetensors")):
            out = tmp_path / f"model.{extension}"
            assert export_here(run_dir, "--format", format, "--out", out) == 0
            assert out.stat().st_mode & 0o777 == 0o666 & ~umask, format
    finally:
        os.umask(previous)
