"""Unequal shares of an epoch's rows (cluster.balance) through the command line, with a worker killed mid-epoch.

Fixed speeds [3, 1]: every epoch the first worker trains three rows for each of the second's, and a job
whose worker is SIGKILLed in epoch 2 and restarted ends with the weights of the uninterrupted job. Speed
shares: one worker sleeps in every step, so the shares move to the other after the first epoch; a worker
killed in epoch 2 is restarted, and the epoch trained again takes exactly the shares the checkpoint held.
A run resumed with another cluster.balance is refused in one line.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shoal.events import read_events
from tests.e2e.jobs import write_task

TIMEOUT = 100
EPOCHS = 4
ROWS = 6002  # not a multiple of 4: the fixed 3:1 shares fall between two rows
NOMINAL_STEPS = 47  # an equal share: 6002 rows, 2 trainers, batch 64
SPEEDS = [3, 1]
STEP_DELAY = 0.005  # the slow worker's sleep per step: several times a fast step


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("task"), rows=ROWS, test_rows=200)


def write_job(path: Path, task, *, algorithm: str, balance: str, model: str) -> Path:
    """A two-class job of EPOCHS epochs with a checkpoint after each (all kept), its rows shared by `balance`."""
    train, test = task
    options = "period = 5" if algorithm == "averaging" else ""
    path.write_text(f"""
[model]
{model}
[data]
train = "{train}"
test = "{test}"
[algorithm]
name = "{algorithm}"
{options}
[train]
epochs = {EPOCHS}
batch_size = 64
optimizer = {{ name = "adam", lr = 0.003 }}
[cluster]
balance = {balance}
[checkpoint]
keep = {EPOCHS}
[output]
progress = "lines"
""")
    return path


def sabotaged(action: str = "none", at: int = 0, marker: Path | None = None) -> str:
    """The model of tests.support.models:sabotaged, which SIGKILLs worker rank 1 on its `at`-th step."""
    return (f'factory = "tests.support.models:sabotaged"\n'
            f'arguments = {{ action = "{action}", at = {at}, marker = "{marker or ""}" }}')


def shoal(*arguments, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, arguments)], capture_output=True, text=True,
                          env=env, timeout=TIMEOUT)


def events(run_dir: Path, kind: str) -> list[dict]:
    return [event for event in read_events(run_dir) if event["event"] == kind]


def rows_by_rank(epoch: dict) -> list[int]:
    return [worker["rows"] for worker in sorted(epoch["workers"], key=lambda worker: worker["rank"])]


def weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "model.pt", weights_only=True)["state_dict"]


def assert_fixed_shares(run_dir: Path) -> None:
    """Every epoch: rows 3:1 within a row, summing to the training rows, and no move."""
    ended = events(run_dir, "epoch_end")
    assert sorted({epoch["epoch"] for epoch in ended}) == list(range(1, EPOCHS + 1))
    for epoch in ended:
        rows = rows_by_rank(epoch)
        assert sum(rows) == ROWS == epoch["samples"], epoch
        for held, speed in zip(rows, SPEEDS):
            assert abs(held - ROWS * speed / sum(SPEEDS)) <= 1, (epoch["epoch"], rows)
        assert epoch["balance"] == "fixed" and "next_shares" not in epoch, epoch
        assert [worker["share"] for worker in epoch["workers"]] == pytest.approx([0.75, 0.25], abs=1e-3)


@pytest.fixture(scope="module")
def uninterrupted(task, tmp_path_factory, project_env_module):
    """Run directories of the fixed-speed jobs run from start to end, by algorithm (run when first asked)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    runs: dict[str, Path] = {}

    def run(algorithm: str) -> Path:
        if algorithm not in runs:
            job = write_job(folder / f"{algorithm}.toml", task, algorithm=algorithm, balance=str(SPEEDS),
                            model=sabotaged())
            finished = shoal("train", job, "--workers", 2, "--run-dir", folder / algorithm, env=project_env_module)
            assert finished.returncode == 0, finished.stderr
            runs[algorithm] = folder / algorithm
        return runs[algorithm]

    return run


@pytest.mark.timeout(3 * TIMEOUT)
@pytest.mark.parametrize("algorithm", ["sync", "averaging"])
def test_fixed_speeds_share_the_rows_and_a_restart_keeps_the_weights(task, uninterrupted, algorithm, tmp_path,
                                                                     project_env):
    reference = uninterrupted(algorithm)
    assert_fixed_shares(reference)

    # rank 1 holds a quarter of the rows: with sync it still runs the nominal steps (smaller batches), with
    # averaging its own (a quarter of the rows, batches of 64); either way, killed 10 steps into epoch 2
    steps = NOMINAL_STEPS if algorithm == "sync" else math.ceil(ROWS / 4 / 64)
    marker = tmp_path / "fired"
    job = write_job(tmp_path / "job.toml", task, algorithm=algorithm, balance=str(SPEEDS),
                    model=sabotaged("kill", steps + 10, marker))
    run_dir = tmp_path / "run"
    finished = shoal("train", job, "--workers", 2, "--run-dir", run_dir, "--max-restarts", 1, env=project_env)
    assert finished.returncode == 0, finished.stderr
    assert marker.exists()
    failed = events(run_dir, "worker_failed")
    assert [(event["rank"], event["signal"]) for event in failed] == [(1, "SIGKILL")], failed
    assert [event["from_epoch"] for event in events(run_dir, "job_restarted")] == [1]
    assert events(run_dir, "job_end")[-1]["status"] == "completed"
    assert_fixed_shares(run_dir)
    got, wanted = weights(run_dir), weights(reference)
    assert got.keys() == wanted.keys()
    assert all(torch.equal(got[name], wanted[name]) for name in got), "weights differ from the uninterrupted run"


def uneven(trainers: list[int], at: int, marker: Path) -> str:
    """tests.support.uneven: the first trainer sleeps in every step, the last is SIGKILLed on its `at`-th."""
    return (f'factory = "tests.support.uneven:uneven"\n'
            f'arguments = {{ slow = {trainers[0]}, delay = {STEP_DELAY}, victim = {trainers[-1]}, at = {at}, '
            f'marker = "{marker}" }}')


@pytest.mark.timeout(2 * TIMEOUT)
@pytest.mark.parametrize(("algorithm", "workers"), [("averaging", 2), ("downpour", 3)])
def test_speed_shares_survive_a_restart(task, algorithm, workers, tmp_path, project_env):
    trainers = list(range(workers - 2, workers))  # downpour's rank 0 serves
    marker = tmp_path / "fired"
    # the fast trainer runs 47 steps in epoch 1 and more in epoch 2 (its share grows): killed 20 steps into it
    job = write_job(tmp_path / "job.toml", task, algorithm=algorithm, balance='"speed"',
                    model=uneven(trainers, NOMINAL_STEPS + 20, marker))
    run_dir = tmp_path / "run"
    finished = shoal("train", job, "--workers", workers, "--run-dir", run_dir, "--max-restarts", 1, env=project_env)
    assert finished.returncode == 0, finished.stderr
    assert marker.exists()
    failed = events(run_dir, "worker_failed")
    assert [(event["rank"], event["signal"]) for event in failed] == [(trainers[-1], "SIGKILL")], failed
    assert [event["from_epoch"] for event in events(run_dir, "job_restarted")] == [1]
    assert events(run_dir, "job_end")[-1]["status"] == "completed"

    ended = events(run_dir, "epoch_end")
    assert [epoch["epoch"] for epoch in ended] == list(range(1, EPOCHS + 1))  # epoch 2 never ended before the kill
    for epoch in ended:
        assert sum(rows_by_rank(epoch)) == ROWS == epoch["samples"], epoch
        assert epoch["balance"] == "speed"
        assert [worker["rank"] for worker in epoch["workers"]] == trainers
        assert all(worker["rate"] > 0 for worker in epoch["workers"]), epoch
    first, again = ended[0], ended[1]
    assert rows_by_rank(first) == [ROWS // 2, ROWS // 2]
    # the slow trainer's rows moved to the fast one after epoch 1
    planned = first.get("next_shares")
    assert planned is not None and planned[0] < planned[1] and sum(planned) == ROWS, first

    for rank in range(workers):  # every rank's file holds the shares epoch 2 was to train on
        saved = torch.load(run_dir / "checkpoints" / "epoch-00001" / f"rank-{rank:05d}.pt", weights_only=True)
        assert saved["balance"]["shares"] == planned, (rank, saved["balance"])
        assert all(rate > 0 for rate in saved["balance"]["rates"]), saved["balance"]
    assert rows_by_rank(again) == planned, "the epoch trained again did not take the checkpoint's shares"
    loaded = events(run_dir, "data_loaded")[-1]  # after the restart: what each trainer holds from the start
    assert [loaded["shares"][rank]["rows"] for rank in trainers] == planned, loaded


@pytest.mark.parametrize("balance", ["equal", "[1, 3]"])
def test_resuming_with_another_balance_is_refused(uninterrupted, balance, tmp_path, project_env):
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted("averaging"), run_dir)
    (run_dir / "model.pt").unlink()
    before = list(read_events(run_dir))
    finished = shoal("train", "--resume", run_dir, "--trust-code", "--set", f"cluster.balance={balance}",
                     env=project_env)
    assert finished.returncode == 2, finished.stderr
    lines = finished.stderr.strip().splitlines()
    assert len(lines) == 1, finished.stderr
    assert lines[0].startswith("shoal: error: cluster.balance: the checkpoints in "), lines[0]
    assert "[3, 1]" in lines[0], lines[0]
    assert list(read_events(run_dir)) == before and not (run_dir / "model.pt").exists()
