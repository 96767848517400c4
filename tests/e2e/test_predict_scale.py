"""Prediction at scale: an unlabeled dataset, larger than the memory budget, predicted by 2 processes
a batch at a time, equals one process's predictions row for row; unlabeled rows are refused for training."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

import shoal
from shoal.data.importers import import_dataset
from shoal.errors import ConfigError, DataError
from tests.e2e.jobs import FEATURES

ROWS, BUDGET = 20_000, 64 * 1024  # 1.6 MB of features against 64 kB at a time


@pytest.fixture(scope="module")
def setup(tmp_path_factory, small_run):
    folder = tmp_path_factory.mktemp("scale")
    run_dir, _ = small_run
    rows = np.random.default_rng(5).normal(size=(ROWS, FEATURES)).astype(np.float32)
    np.save(folder / "rows.npy", rows)
    unlabeled = import_dataset(folder / "rows.npy", folder / "unlabeled", "npy", unlabeled=True)
    return folder, run_dir, unlabeled


def test_two_processes_in_bounded_memory_equal_one(setup, tmp_path, project_env):
    folder, run_dir, unlabeled = setup
    assert not unlabeled.labeled and unlabeled.classes is None
    assert shoal.predict(run_dir, unlabeled.path, tmp_path / "one.parquet") == ROWS
    finished = subprocess.run([sys.executable, "-m", "shoal", "predict", str(run_dir), unlabeled.path, "--out",
                               str(tmp_path / "two.parquet"), "--workers", "2", "--memory", str(BUDGET)],
                              capture_output=True, text=True, env=project_env, timeout=180)
    assert finished.returncode == 0, finished.stderr
    one, two = pq.read_table(tmp_path / "one.parquet"), pq.read_table(tmp_path / "two.parquet")
    assert two.column_names == ["prediction", "probability_no", "probability_yes"]  # no label to show
    assert two.column("prediction").to_pylist() == one.column("prediction").to_pylist()
    for name in ("probability_no", "probability_yes"):
        assert np.allclose(two.column(name).to_numpy(), one.column(name).to_numpy(), atol=1e-6)
    # read and written a batch at a time: each batch of at most 64 kB / (20 x 16) = 204 rows is a row group
    assert pq.ParquetFile(tmp_path / "two.parquet").num_row_groups >= ROWS // 204
    assert not list(tmp_path.glob(".two.parquet*"))  # the parts and the temporary file are gone


def test_unlabeled_rows_are_not_trained_on(setup, tmp_path):
    folder, _, unlabeled = setup
    job = {"model": {"layers": [{"dense": 2}]}, "data": {"train": unlabeled.path}, "output": {"progress": "none"}}
    with pytest.raises(ConfigError, match="data.train: .* has no labels") as raised:
        shoal.fit(job, workers=1, run_dir=tmp_path / "run")
    assert "\n" not in str(raised.value) and not (tmp_path / "run").exists()
    with pytest.raises(DataError, match="unlabeled: features alone, from npy, csv, parquet"):
        import_dataset(folder / "rows.npy", tmp_path / "other", "npy", unlabeled=True, label=str(folder / "rows.npy"))
