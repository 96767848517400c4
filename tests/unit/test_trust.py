"""Run directories are data: a model.factory found in model.pt or a run's job.toml is imported only on
the user's word (--trust-code, trust_code=True, or the same factory named again), and the MLflow logger a
run's job.toml names sends nothing without it; factories never change sys.path for good, and whatever a
factory raises is one line."""

from __future__ import annotations

import http.server
import json
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from torch import nn

import shoal
from shoal.api import resumed_job
from shoal.cli import main, trust_flag
from shoal.data.format import DatasetWriter
from shoal.errors import ConfigError
from shoal.model import build_model, from_factory
from shoal.run.artifacts import save_model
from tests.support.factories import FACTORIES

pytestmark = pytest.mark.usefixtures("quiet_environment")


def write_dataset(path: Path) -> Path:
    features = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    with DatasetWriter(str(path), (3,), "float32") as writer:
        writer.write(features, (features[:, 0] > 0).astype(np.int64))
    return path


def malicious_spec(marker: Path) -> dict:
    return {"input": [3], "factory": "os:system", "arguments": {"command": f"touch {marker}"}}


def write_run(run_dir: Path, spec: dict) -> Path:
    """A run directory holding a model.pt with this spec (and weights that fit a 3 -> 2 linear layer)."""
    run_dir.mkdir()
    save_model(run_dir, nn.Sequential(nn.Linear(3, 2)), spec, "cross_entropy", [0, 1], "float32")
    return run_dir


def untrusted_line(where: Path, factory: str) -> str:
    return (f"{where}: the model is built by code (model.factory {factory!r}); loading it would run that code: "
            "pass --trust-code (trust_code=True) if you trust this run directory")


# ---------------------------------------------------------------- model.pt: load_model and predict


def test_load_model_refuses_a_factory_from_the_run_directory(tmp_path):
    marker = tmp_path / "ran"
    run_dir = write_run(tmp_path / "run", malicious_spec(marker))
    with pytest.raises(ConfigError) as caught:
        shoal.load_model(run_dir)
    assert str(caught.value) == untrusted_line(run_dir / "model.pt", "os:system")
    assert not marker.exists()


def test_predict_refuses_a_factory_from_the_run_directory(tmp_path, capsys):
    marker = tmp_path / "ran"
    run_dir = write_run(tmp_path / "run", malicious_spec(marker))
    data, out = write_dataset(tmp_path / "data"), tmp_path / "predictions.parquet"
    with pytest.raises(ConfigError, match="loading it would run that code"):
        shoal.predict(run_dir, str(data), out)
    assert main(["predict", str(run_dir), str(data), "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"shoal: error: {untrusted_line(run_dir / 'model.pt', 'os:system')}\n"
    assert not marker.exists() and not out.exists()


def test_a_trusted_factory_model_loads_and_predicts(tmp_path, factories, capsys):
    spec = {"input": [3], "factory": f"{factories}:mlp", "arguments": {"features": 3}}
    run_dir = write_run(tmp_path / "run", spec)
    model = shoal.load_model(run_dir, trust_code=True)
    assert isinstance(model, nn.Sequential) and not model.training
    data, out = write_dataset(tmp_path / "data"), tmp_path / "predictions.parquet"
    assert main(["predict", str(run_dir), str(data), "--out", str(out), "--trust-code"]) == 0
    assert capsys.readouterr().out == f"{out}: 40 predictions\n"


def test_trusting_one_factory_does_not_trust_another(tmp_path):
    marker = tmp_path / "ran"
    run_dir = write_run(tmp_path / "run", malicious_spec(marker))
    with pytest.raises(ConfigError, match="model.factory 'os:system'"):
        shoal.load_model(run_dir, trust_code=f"{FACTORIES}:mlp")
    assert not marker.exists()


def test_a_layer_list_needs_no_trust(tmp_path):
    run_dir = write_run(tmp_path / "run", {"input": [3], "layers": [{"dense": 2}]})
    assert isinstance(shoal.load_model(run_dir), nn.Sequential)


# ---------------------------------------------------------------- resume: the run's job.toml


def write_resumable(tmp_path: Path, marker: Path, factory: str = "os:system") -> Path:
    """A run directory whose job.toml names a factory (nothing else is needed to refuse it)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    train = write_dataset(tmp_path / "train")
    (run_dir / "job.toml").write_text(textwrap.dedent(f"""
        [model]
        factory = "{factory}"
        arguments = {{ command = "touch {marker}" }}
        [data]
        train = "{train}"
    """))
    return run_dir


def test_resume_trusts_the_run_when_told_or_when_the_factory_is_named_again(tmp_path):
    run_dir = write_resumable(tmp_path, tmp_path / "ran")
    assert resumed_job(run_dir, trust_code=True).model.factory == "os:system"
    assert resumed_job(run_dir, ["model.factory=os:system"]).model.factory == "os:system"
    assert resumed_job(run_dir, ['model.factory="os:system"']).model.factory == "os:system"
    assert not (tmp_path / "ran").exists()  # deciding to trust builds nothing
    assert trust_flag(resumed_job(run_dir, trust_code=True)) == " --trust-code"  # what an interrupted job suggests


# ---------------------------------------------------------------- factories: sys.path and one-line errors


def test_a_factory_in_the_current_folder_imports_and_sys_path_is_left_as_found(factories):
    assert str(Path.cwd()) not in sys.path
    before = list(sys.path)
    model = build_model({"input": [4], "factory": f"{factories}:mlp", "arguments": {"features": 4}})
    assert isinstance(model, nn.Sequential)
    assert sys.path == before


def test_a_factory_that_raises_is_one_line_naming_it(factories):
    with pytest.raises(ConfigError) as caught:
        from_factory(f"{factories}:broken", {"features": 3})
    assert str(caught.value) == f"model.factory: '{factories}:broken' failed: ValueError: no width fits"


def test_a_type_error_inside_the_factory_is_not_blamed_on_the_arguments(factories):
    with pytest.raises(ConfigError, match=rf"^model\.factory: '{factories}:mistyped' failed: TypeError: "):
        from_factory(f"{factories}:mistyped", {"features": 3})
    with pytest.raises(ConfigError, match=rf"^model\.arguments: '{factories}:mistyped' refused them: "):
        from_factory(f"{factories}:mistyped", {"width": 3})


def test_a_module_that_fails_as_it_loads_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "shoal_trust_broken_module.py").write_text("raise RuntimeError('cannot start\\nat all')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "shoal_trust_broken_module", raising=False)
    before = list(sys.path)
    with pytest.raises(ConfigError) as caught:
        from_factory("shoal_trust_broken_module:build", {})
    assert str(caught.value) == "model.factory: cannot import 'shoal_trust_broken_module:build': cannot start"
    assert sys.path == before


# ---------------------------------------------------------------- resume: commands the run's job.toml names


def write_remote_run(tmp_path: Path, marker: Path, hosts: bool = True) -> Path:
    """A copied run directory whose job.toml names a remote command that touches `marker` (and trains nothing)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    train = write_dataset(tmp_path / "train")
    hosts_line = 'hosts = ["localhost"]' if hosts else ""
    (run_dir / "job.toml").write_text(textwrap.dedent(f"""
        [model]
        layers = [{{ dense = 2 }}]
        [data]
        train = "{train}"
        [cluster]
        {hosts_line}
        remote = "sh -c 'touch {marker}; echo x' {{host}}"
    """))
    return run_dir


def test_resume_on_named_hosts_refuses_the_run_directorys_remote_command(tmp_path, capsys):
    marker = tmp_path / "PWNFILE"
    run_dir = write_remote_run(tmp_path, marker, hosts=False)
    assert main(["train", "--resume", str(run_dir), "--hosts", "h"]) == 2  # as the interrupt message suggests
    assert "cluster.remote" in capsys.readouterr().err
    assert not marker.exists()


# ---------------------------------------------------------------- model.object: inside the run directory only


def ship(run_dir: Path, name: str = "model.object.pkl") -> Path:
    from shoal.objects import save_object

    run_dir.mkdir(exist_ok=True)
    return save_object(nn.Linear(3, 2), run_dir / name, "model")


def test_a_shipped_model_is_read_from_the_run_directory(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    ship(run_dir)
    monkeypatch.chdir(tmp_path)
    assert isinstance(build_model({"input": [3], "object": "model.object.pkl"}, run_dir), nn.Linear)


@pytest.mark.parametrize("name", ["/etc/passwd", "../outside.pkl", "sub/../../outside.pkl"])
def test_a_model_object_outside_the_run_directory_is_refused(tmp_path, name):
    run_dir = tmp_path / "run"
    ship(tmp_path, "outside.pkl")
    ship(run_dir)
    with pytest.raises(ConfigError, match=r"^model\.object: .* must name a file inside the run directory"):
        build_model({"input": [3], "object": name}, run_dir)


def test_a_model_object_symlinked_out_of_the_run_directory_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "model.object.pkl").symlink_to(ship(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError) as caught:
        build_model({"input": [3], "object": "model.object.pkl"}, run_dir)
    assert str(caught.value) == (f"model.object: {run_dir / 'model.object.pkl'} leads out of the run directory "
                                 f"{run_dir}")


def test_a_copied_run_without_its_pickle_does_not_read_the_originals(tmp_path, monkeypatch):
    original, copy = tmp_path / "original", tmp_path / "copy"
    ship(original)
    copy.mkdir()
    monkeypatch.chdir(original)  # not even the current folder is looked in
    with pytest.raises(ConfigError) as caught:
        build_model({"input": [3], "object": "model.object.pkl"}, copy)
    assert str(caught.value) == f"model.object: {copy / 'model.object.pkl'}: no such file in the run directory"


# ---------------------------------------------------------------- resume: the user's own code the job names


@pytest.mark.parametrize("key,toml", [
    ("train.step", 'train = { step = "os:system" }'),
    ("data.transform", 'transform = "os:system"'),
    ("train.loss", 'train = { loss = "train.loss.pkl" }'),
    ("train.scheduler.factory", 'train = { scheduler = { factory = "os:system" } }'),
    ("train.metrics.f1", 'train = { metrics = { f1 = "os:system" } }'),
])
def test_a_run_naming_code_of_its_own_is_resumed_only_when_trusted_or_given_again(tmp_path, key, toml):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    train = write_dataset(tmp_path / "train")
    in_data = key == "data.transform"
    (run_dir / "job.toml").write_text(f'model = {{ layers = [{{ dense = 2 }}] }}\n'
                                      f'data = {{ train = "{train}"{", " + toml if in_data else ""} }}\n'
                                      f'{"" if in_data else toml}\n')
    reference = toml.split('"')[1]
    with pytest.raises(ConfigError) as caught:
        resumed_job(run_dir)
    assert str(caught.value) == (f"{run_dir / 'job.toml'}: {key} {reference!r} is code; resuming would run it: pass "
                                 f"--trust-code (trust_code=True) if you trust this run directory, or give it again "
                                 f"(--set {key}=...)")
    assert resumed_job(run_dir, trust_code=True) is not None
    assert resumed_job(run_dir, [f'{key}="{reference}"']) is not None
    assert trust_flag(resumed_job(run_dir, trust_code=True)) == " --trust-code"


# ---------------------------------------------------------------- resume: where the run's records would go


class Listener(http.server.BaseHTTPRequestHandler):
    """Records every request and answers it with an MLflow error (a client gives up at once, not retrying)."""

    def answer(self) -> None:
        self.server.requests.append(f"{self.command} {self.path}")
        body = json.dumps({"error_code": "INVALID_PARAMETER_VALUE", "message": "refused by the test"}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = answer

    def log_message(self, *arguments) -> None:
        pass


@pytest.fixture
def tracking_server() -> Iterator[http.server.ThreadingHTTPServer]:
    """A real HTTP server on 127.0.0.1 standing in for an MLflow tracking server; `.requests` lists what it got."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def server_uri(server: http.server.ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def write_logged_run(tmp_path: Path, output: str) -> Path:
    """A copied run directory whose job.toml has this [output] table (and nothing else to refuse)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    train = write_dataset(tmp_path / "train")
    (run_dir / "job.toml").write_text(f'model = {{ layers = [{{ dense = 2 }}] }}\ndata = {{ train = "{train}" }}\n'
                                      f'[output]\n{output}\n')
    return run_dir


def sent_line(run_dir: Path, key: str, value, where: str) -> str:
    return (f"{run_dir / 'job.toml'}: {key} {value!r}: resuming would send the run's settings (data paths included) "
            f"and metrics to MLflow {where}: pass --trust-code (trust_code=True) if you trust this run directory, "
            f"or give it again (--set {key}=...)")


def test_a_run_naming_an_mlflow_server_is_resumed_only_when_trusted_or_given_again(tmp_path, tracking_server):
    uri = server_uri(tracking_server)
    run_dir = write_logged_run(tmp_path, f'loggers = ["mlflow"]\nmlflow_uri = "{uri}"\nmlflow_experiment = "x"')
    with pytest.raises(ConfigError) as caught:
        resumed_job(run_dir)
    assert str(caught.value) == sent_line(run_dir, "output.loggers", ["mlflow"], f"at {uri!r}")
    with pytest.raises(ConfigError) as caught:  # the Python API the same, before anything starts
        shoal.resume(run_dir)
    assert str(caught.value) == sent_line(run_dir, "output.loggers", ["mlflow"], f"at {uri!r}")
    # the logger given again does not vouch for the server or the experiment the run names
    with pytest.raises(ConfigError, match=r": output\.mlflow_uri 'http://127\.0\.0\.1:\d+': resuming would send"):
        resumed_job(run_dir, ['output.loggers=["mlflow"]'])
    with pytest.raises(ConfigError, match=r": output\.mlflow_experiment 'x': resuming would send"):
        resumed_job(run_dir, ['output.loggers=["mlflow"]', f'output.mlflow_uri="{uri}"'])
    assert resumed_job(run_dir, ['output.loggers=["mlflow"]', f'output.mlflow_uri="{uri}"',
                                 'output.mlflow_experiment="x"']).output.mlflow_uri == uri
    assert resumed_job(run_dir, ['output.loggers=["csv"]']).output.loggers == ["csv"]  # MLflow off: nothing sent
    trusted = resumed_job(run_dir, trust_code=True)
    assert trusted.output.mlflow_uri == uri
    assert trust_flag(trusted) == " --trust-code"  # what an interrupted job suggests
    assert tracking_server.requests == []  # deciding sends nothing


def test_mlflow_in_the_run_directory_is_refused_too_and_csv_and_tensorboard_are_not(tmp_path):
    run_dir = write_logged_run(tmp_path, 'loggers = ["csv", "tensorboard", "mlflow"]')
    with pytest.raises(ConfigError) as caught:
        resumed_job(run_dir)
    assert str(caught.value) == sent_line(run_dir, "output.loggers", ["csv", "tensorboard", "mlflow"],
                                          "in the run directory's mlruns")
    (run_dir / "job.toml").write_text((run_dir / "job.toml").read_text().replace(', "mlflow"', ""))
    job = resumed_job(run_dir)  # they write at fixed names inside the run directory
    assert job.output.loggers == ["csv", "tensorboard"] and trust_flag(job) == ""


def test_mlflow_settings_without_the_logger_are_inert(tmp_path):
    run_dir = write_logged_run(tmp_path, 'mlflow_uri = "file:///etc"\nmlflow_experiment = "x"')
    assert resumed_job(run_dir).output.loggers == []
