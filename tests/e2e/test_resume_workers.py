"""A run of 2 workers resumed on another number of workers through the command line, one per family.

Synchronous SGD, averaging with a period and Downpour go on with 3 workers, synchronous EASGD with
one. Each resumed job completes, its first epoch goes on from the checkpoint (its loss near the
checkpoint's last epoch's, well below the first epoch's), its `job_resumed` says from how many
workers it was resharded, and `shoal status` reads it. Two reshards of the same checkpoint onto the
same count end with the same weights.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shoal.events import read_events
from shoal.run.status import render, summarize
from tests.e2e.jobs import MODEL, write_task

TIMEOUT = 60


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("task"), rows=2000, test_rows=200)


def write_job(path: Path, task, algorithm: str, options: str) -> Path:
    """A two-class job of 2 epochs, with a checkpoint after each."""
    train, test = task
    path.write_text(f"""
[model]
{MODEL}
[data]
train = "{train}"
test = "{test}"
[algorithm]
name = "{algorithm}"
{options}
[train]
epochs = 2
batch_size = 64
optimizer = {{ name = "adam", lr = 0.01 }}
[output]
progress = "lines"
""")
    return path


def shoal(*arguments, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, arguments)], capture_output=True, text=True,
                          env=env, timeout=TIMEOUT)


def events(run_dir: Path, kind: str) -> list[dict]:
    return [event for event in read_events(run_dir) if event["event"] == kind]


def weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "model.pt", weights_only=True)["state_dict"]


@pytest.mark.timeout(4 * TIMEOUT)
@pytest.mark.parametrize(("algorithm", "options", "workers", "trainers"), [
    ("sync", "", 3, 3),
    ("averaging", "period = 5", 3, 3),
    ("easgd", "synchronous = true\nperiod = 4", 1, 1),
    ("downpour", "sync_every = 2", 3, 2),
], ids=["sync", "averaging", "easgd", "downpour"])
def test_a_run_of_2_workers_resumes_on_another_count(task, algorithm, options, workers, trainers, tmp_path,
                                                      project_env):
    job = write_job(tmp_path / "job.toml", task, algorithm, options)
    run_dir = tmp_path / "run"
    finished = shoal("train", job, "--workers", 2, "--run-dir", run_dir, env=project_env)
    assert finished.returncode == 0, finished.stderr
    if algorithm == "averaging":
        again = shutil.copytree(run_dir, tmp_path / "again")

    resumed = shoal("train", "--resume", run_dir, "--workers", workers, "--set", "train.epochs=3", env=project_env)
    assert resumed.returncode == 0, resumed.stderr
    assert events(run_dir, "job_end")[-1]["status"] == "completed"
    record = events(run_dir, "job_resumed")
    assert [(event["from_epoch"], event["resharded_from"], event["world_size"]) for event in record] == \
        [(2, 2, workers)]
    losses = {event["epoch"]: event["train_loss"] for event in events(run_dir, "epoch_end")}
    assert sorted(losses) == [1, 2, 3]
    # the first resumed epoch goes on from epoch 2's weights: nearer its loss than a fresh start's
    assert losses[3] < losses[2] + (losses[1] - losses[2]) / 2, losses
    before = 1 if algorithm == "downpour" else 2  # downpour's rank 0 serves
    assert [len(event["workers"]) for event in events(run_dir, "epoch_end")] == [before] * 2 + [trainers]
    assert "completed" in render(summarize(run_dir))

    if algorithm == "averaging":  # the same reshard again: the same weights
        twice = shoal("train", "--resume", again, "--workers", workers, "--set", "train.epochs=3", env=project_env)
        assert twice.returncode == 0, twice.stderr
        first, second = weights(run_dir), weights(again)
        assert all(torch.equal(first[name], second[name]) for name in first), "two reshards differ"
