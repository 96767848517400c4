"""A model object shipped by `shoal.fit` is named relative to the run directory, so the run can be moved; a copied
run's MLflow server is reached only on the user's word."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import numpy as np
import pytest
import tomli_w
from torch import nn

import shoal
from tests.unit.test_trust import server_uri, tracking_server, write_dataset  # noqa: F401 (a fixture)

TIMEOUT = 120


def test_fit_names_the_shipped_model_relative_to_the_run_directory(tmp_path):
    features = np.random.default_rng(0).normal(size=(32, 3)).astype(np.float32)
    result = shoal.fit(model=nn.Linear(3, 2), train=(features, (features[:, 0] > 0).astype(np.int64)), workers=1,
                       epochs=1, run_dir=tmp_path / "run", output={"progress": "none"}, checkpoint={"every": 0})
    assert 'object = "model.object.pkl"' in (result.run_dir / "job.toml").read_text()
    assert isinstance(result.model, nn.Linear)


def test_a_copied_run_naming_an_mlflow_server_reaches_it_only_when_trusted(tmp_path, project_env,
                                                                            tracking_server):  # noqa: F811
    pytest.importorskip("mlflow", reason="the mlflow logger's package (shoal[mlflow]) is not installed")
    run_dir = shoal.fit(model={"layers": [{"dense": 2}]}, train=str(write_dataset(tmp_path / "train")), workers=1,
                        epochs=1, run_dir=tmp_path / "run", output={"progress": "none"}).run_dir
    job = tomllib.loads((run_dir / "job.toml").read_text())
    job["output"] |= {"loggers": ["mlflow"], "mlflow_uri": server_uri(tracking_server)}  # as a copied run may say
    (run_dir / "job.toml").write_text(tomli_w.dumps(job))
    resume = [sys.executable, "-m", "shoal", "train", "--resume", str(run_dir), "--set", "train.epochs=2"]
    environment = project_env | {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    refused = subprocess.run(resume, capture_output=True, text=True, env=environment, timeout=TIMEOUT)
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"shoal: error: {run_dir / 'job.toml'}: output.loggers ['mlflow']: resuming "
                                     "would send") and refused.stderr.count("\n") == 1
    assert tracking_server.requests == []
    trusted = subprocess.run([*resume, "--trust-code"], capture_output=True, text=True, env=environment,
                             timeout=TIMEOUT)
    assert trusted.returncode == 0, trusted.stderr
    assert tracking_server.requests  # the logger reached the server; it refused, so the logger is off, not the job
    assert "shoal: warning: the mlflow logger failed and is off for the rest of the job" in trusted.stderr
