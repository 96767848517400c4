"""A worker 5x slower than the others: asynchronous Downpour lets the others run on, synchronous does not.

Each run has a parameter server and 3 trainers. The slow trainer sleeps in every training
step, long enough to take 5x its unslowed step time (measured first). The other trainers'
step rates (steps per second of their own epoch time, from `epoch_end`) are compared with
the same job unslowed.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.events import read_events
from tests.e2e.jobs import write_job, write_task

ROOT = Path(__file__).resolve().parents[2]
SLOW_RANK = 2
TIMEOUT = 240


def step_rates(job: Path, run_dir: Path, env: dict, synchronous: bool, delay: float) -> dict[int, float]:
    """Median steps per second of each trainer over the epochs after the first."""
    finished = subprocess.run(
        [sys.executable, "-m", "shoal", "train", str(job), "--workers", "4", "--run-dir", str(run_dir),
         "--set", f"algorithm.synchronous={str(synchronous).lower()}",
         "--set", f"model.arguments={{ features = 20, rank = {SLOW_RANK}, delay = {delay} }}"],
        capture_output=True, text=True, env=env, timeout=TIMEOUT, cwd=ROOT)
    assert finished.returncode == 0, finished.stderr
    epochs = [e for e in read_events(run_dir) if e["event"] == "epoch_end"][1:]
    ranks = [w["rank"] for w in epochs[0]["workers"]]
    return {rank: statistics.median(w["steps_per_second"] for e in epochs for w in e["workers"] if w["rank"] == rank)
            for rank in ranks}


@pytest.mark.slow
@pytest.mark.timeout(5 * TIMEOUT)
def test_asynchronous_downpour_is_not_held_up_by_a_straggler(tmp_path, project_env):
    train, test = write_task(tmp_path / "task", rows=6000, test_rows=200)
    job = write_job(tmp_path / "job.toml", train, test, algorithm="downpour", epochs=2,
                    model='factory = "tests.support.models:straggling"', extra="[checkpoint]\nevery = 0")
    plain = step_rates(job, tmp_path / "async-plain", project_env, False, 0.0)
    fast = [rank for rank in plain if rank != SLOW_RANK]
    delay = 4.0 / plain[SLOW_RANK]  # four more step times asleep: 5x the step time
    slowed = step_rates(job, tmp_path / "async-slowed", project_env, False, delay)
    assert slowed[SLOW_RANK] <= plain[SLOW_RANK] / 3, (plain, slowed)  # the straggler is slow indeed
    # Held up, the fast trainers would fall to the straggler's pace (1/5 of theirs). 4 processes sharing
    # 2 cores move one trainer's rate by up to a third from run to run, and apart from the others' in the
    # same run (275 against 350 steps/s once), so the fast trainers are compared as a group, with a margin.
    pace_kept = statistics.mean(slowed[rank] for rank in fast) / statistics.mean(plain[rank] for rank in fast)
    assert pace_kept >= 0.5, (plain, slowed)

    # Synchronous rounds wait for the straggler: the others fall to its pace. (Against the unslowed
    # asynchronous run; an unslowed synchronous one is no faster, so the comparison is the stricter.)
    sync_slowed = step_rates(job, tmp_path / "sync-slowed", project_env, True, delay)
    for rank in fast:
        assert sync_slowed[rank] <= 0.5 * plain[rank], (rank, plain, sync_slowed)
