"""A `shoal predict` killed outright takes its pool workers and multiprocessing's resource tracker with it,
and the parts folder it left is swept by the next predict to the same file (never a live one's); the
temporary output is a new file under a name no one can foresee, so a link planted there is never followed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest

import shoal
from shoal.data import leftovers
from shoal.data.importers import import_dataset
from shoal.errors import ShoalError
from shoal.inference import predictions
from tests.e2e.jobs import FEATURES

ROWS = 200_000  # with 16 kB batches, a couple of minutes of work for two processes: killed well before the end


@pytest.fixture(scope="module")
def setup(tmp_path_factory, small_run):
    folder = tmp_path_factory.mktemp("leftovers")
    run_dir, test = small_run
    np.save(folder / "rows.npy", np.random.default_rng(3).normal(size=(ROWS, FEATURES)).astype(np.float32))
    rows = import_dataset(folder / "rows.npy", folder / "rows", "npy", unlabeled=True)
    return run_dir, rows.path, test


def started_predict(run_dir, rows: str, out, env: dict, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shoal", "predict", str(run_dir), rows, "--out", str(out),
                             "--workers", "2", "--memory", "16KB"], env=env, stdout=log, stderr=log)


def parts_of(out, pid: int) -> list:
    return list(out.parent.glob(f".{out.name}.parts.*.{pid}.*"))


@pytest.mark.timeout(120)
def test_a_killed_predict_leaves_no_process_and_the_next_predict_sweeps_its_parts(setup, tmp_path, project_env):
    run_dir, rows, test = setup
    out = tmp_path / "out.parquet"
    with open(tmp_path / "log", "w") as log:
        killed = started_predict(run_dir, rows, out, project_env, log)
    try:
        deadline = time.monotonic() + 60
        while len([part for folder in parts_of(out, killed.pid) for part in folder.iterdir()]) < 2:
            assert killed.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()
            time.sleep(0.1)  # both workers are writing their parts: mid-way
        children = psutil.Process(killed.pid).children(recursive=True)
        assert len(children) >= 3  # two workers and the resource tracker
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
        _, alive = psutil.wait_procs(children, timeout=5)
        assert not alive, [process.cmdline() for process in alive]
    finally:
        killed.kill()
        killed.wait()
    [stale] = parts_of(out, killed.pid)
    live = tmp_path / leftovers.owned_name(f".{out.name}.parts")  # this process's: a predict still going
    live.mkdir()
    assert shoal.predict(run_dir, str(test), out) == 200
    assert not stale.exists() and live.is_dir()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["log", out.name, live.name])


def test_a_link_planted_at_the_temporary_name_is_never_followed(setup, tmp_path, monkeypatch):
    run_dir, _, test = setup
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out.parquet"
    (tmp_path / f".{out.name}.tmp").symlink_to(victim)  # the name an earlier shoal used
    assert shoal.predict(run_dir, str(test), out) == 200
    assert victim.read_text() == "precious" and pq.read_table(out).num_rows == 200
    owned_name = leftovers.owned_name
    planted = f".{out.name}.foreseen.tmp"
    (tmp_path / planted).symlink_to(victim)
    monkeypatch.setattr(predictions.leftovers, "owned_name",
                        lambda stem: planted if stem == f".{out.name}" else owned_name(stem))
    with pytest.raises(ShoalError, match="cannot write predictions: .*File exists") as refused:
        shoal.predict(run_dir, str(test), out, overwrite=True)
    assert "\n" not in str(refused.value)
    assert victim.read_text() == "precious" and (tmp_path / planted).is_symlink()


def test_an_output_that_is_a_link_is_replaced_not_written_through(setup, tmp_path):
    run_dir, _, test = setup
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out.csv"
    out.symlink_to(victim)
    assert shoal.predict(run_dir, str(test), out, overwrite=True) == 200
    assert victim.read_text() == "precious" and not out.is_symlink()
    assert out.read_text().startswith('"prediction"') and os.stat(out).st_size > 0
