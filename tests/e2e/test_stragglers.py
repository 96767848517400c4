"""A straggling trainer: asynchronous Downpour lets the others run on, synchronous Downpour does not.

Each run has a parameter server and 3 trainers, whose training steps count themselves in files
(tests.support.counted_steps), so that the test reads the order of steps rather than their speed. In
the asynchronous run the straggler's first step waits until both other trainers have done their whole
epoch: they can only if nothing they do waits for the straggler. In the synchronous run the straggler
sleeps in every step, and no other trainer is ever found a step ahead of it: each round waits for every
trainer's update. Neither depends on how fast the machine runs. How much of their pace the others keep
beside a straggler is a timing claim, which a loaded machine moves: benchmarks/stragglers.py measures it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.data.partition import steps_per_epoch
from shoal.events import read_events
from tests.e2e.jobs import write_job, write_task

ROOT = Path(__file__).resolve().parents[2]
SLOW_RANK = 2
TRAINERS = [1, 2, 3]  # rank 0 is the server
ROWS = 6000
STEPS = steps_per_epoch(ROWS, len(TRAINERS), 64)  # a trainer's steps in its epoch
HOLD = 60  # seconds the straggler waits at most for the others' epoch: a guard against a hang
TIMEOUT = 120


def straggling_run(job: Path, run_dir: Path, env: dict, synchronous: bool) -> dict:
    """The job trained by a server and 3 trainers: what the straggler found of the others' steps."""
    folder = run_dir.with_name(run_dir.name + "-steps")
    folder.mkdir()
    # asynchronous: the straggler's first step waits for the others' epoch; synchronous: it sleeps in each
    wait_for, delay = (STEPS, 0.0) if not synchronous else (0, 0.02)
    arguments = (f'{{ features = 20, rank = {SLOW_RANK}, folder = "{folder}", trainers = {TRAINERS}, '
                 f"wait_for = {wait_for}, hold = {HOLD}, delay = {delay} }}")
    finished = subprocess.run(
        [sys.executable, "-m", "shoal", "train", str(job), "--workers", "4", "--run-dir", str(run_dir),
         "--set", f"algorithm.synchronous={str(synchronous).lower()}", "--set", f"model.arguments={arguments}"],
        capture_output=True, text=True, env=env, timeout=TIMEOUT, cwd=ROOT)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert [e["status"] for e in read_events(run_dir) if e["event"] == "job_end"] == ["completed"]
    return json.loads((folder / "straggler.json").read_text())


# 7 s on a 2-core machine beside another test run; the asynchronous run waits HOLD seconds at most
@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT)
def test_asynchronous_downpour_is_not_held_up_by_a_straggler(tmp_path, project_env):
    train, test = write_task(tmp_path / "task", rows=ROWS, test_rows=200)
    job = write_job(tmp_path / "job.toml", train, test, algorithm="downpour", epochs=1,
                    model='factory = "tests.support.counted_steps:counted_steps"',
                    extra="[checkpoint]\nevery = 0")
    # asynchronous: while the straggler sat in its first step, both others finished their epoch
    found = straggling_run(job, tmp_path / "async", project_env, synchronous=False)
    assert sorted(found["first"].values()) == [STEPS, STEPS], found
    assert found["steps"] == STEPS, found
    # synchronous: a round needs every trainer's update, so no other trainer began a step the straggler had not
    found = straggling_run(job, tmp_path / "sync", project_env, synchronous=True)
    assert found["ahead"] <= 0 and found["steps"] == STEPS, found
