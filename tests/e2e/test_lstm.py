"""mpi_learn's recurrent workload end to end: examples/sequences-lstm.toml (LSTM(20), softmax(3), Downpour) on rows
`shoal data synth sequences` makes, one epoch on 2 training workers beside the parameter server (synchronous, so
that what it learns does not depend on which trainer's update arrives first)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shoal.events import read_events

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_the_lstm_workload_trains_an_epoch_on_two_workers(tmp_path, project_env):
    for name, rows, seed in (("train", 6000, 1), ("test", 1000, 2)):
        made = subprocess.run([sys.executable, "-m", "shoal", "data", "synth", "sequences", "--rows", str(rows),
                               "--seed", str(seed), "--out", str(tmp_path / name)],
                              capture_output=True, text=True, env=project_env, timeout=120)
        assert made.returncode == 0, made.stderr
    run_dir = tmp_path / "run"
    finished = subprocess.run(
        [sys.executable, "-m", "shoal", "train", str(ROOT / "examples" / "sequences-lstm.toml"), "--workers", "3",
         "--run-dir", str(run_dir), "--set", f"data.train='{tmp_path / 'train'}'",
         "--set", f"data.test='{tmp_path / 'test'}'", "--set", "train.epochs=1",
         "--set", "algorithm.synchronous=true"],  # the server waits for both trainers: the same updates every run
        capture_output=True, text=True, env=project_env, timeout=200, cwd=ROOT)
    assert finished.returncode == 0, finished.stderr
    events = list(read_events(run_dir))
    start = next(event for event in events if event["event"] == "job_start")
    ends = [event for event in events if event["event"] == "epoch_end"]
    assert len(ends) == 1
    assert (start["algorithm"], start["world_size"], start["trainers"]) == ("downpour", 3, 2)
    assert start["config"]["model"]["layers"] == [{"lstm": 20}, {"dense": 3}]
    assert start["parameters"] == 4 * 20 * (4 + 20 + 2) + 20 * 3 + 3  # LSTM(20) over 4 channels, dense 3
    # three classes: chance is 0.33; the synchronous epoch's accuracy is the same on any machine's load
    assert ends[0]["test"]["accuracy"] > 0.5, ends[0]["test"]
