"""Averaging with DiLoCo's outer optimizer through the command line: a killed worker's job restarts from its
checkpoint and ends with the uninterrupted run's weights to the bit (the anchor and the outer momentum come back
from every rank's checkpoint), and the same run resumes on 3 workers."""

from __future__ import annotations

import math

import pytest

from shoal.events import read_events
from tests.e2e.jobs import write_task
from tests.e2e.test_recovery import assert_same_weights, shoal, weights, write_job

TIMEOUT = 60
OUTER = 'period = 5\nouter = { name = "nesterov", lr = 0.7, momentum = 0.9 }'
STEPS_PER_EPOCH = 16  # 2000 rows, 2 workers, batch 64


def events(run_dir, kind: str) -> list[dict]:
    return [event for event in read_events(run_dir) if event["event"] == kind]


@pytest.mark.timeout(4 * TIMEOUT)
def test_a_killed_run_ends_as_the_uninterrupted_one_and_resumes_on_3_workers(tmp_path, project_env):
    task = write_task(tmp_path / "task", rows=2000, test_rows=200)
    reference = write_job(tmp_path / "reference.toml", task, options=OUTER)
    finished = shoal("train", reference, "--workers", 2, "--run-dir", tmp_path / "reference", env=project_env,
                     timeout=TIMEOUT)
    assert finished.returncode == 0, finished.stderr

    job = write_job(tmp_path / "job.toml", task, action="kill", at=STEPS_PER_EPOCH + 8, marker=tmp_path / "fired",
                    options=OUTER)
    run_dir = tmp_path / "run"
    finished = shoal("train", job, "--workers", 2, "--run-dir", run_dir, "--max-restarts", 1, env=project_env,
                     timeout=TIMEOUT)
    assert finished.returncode == 0, finished.stderr
    assert (tmp_path / "fired").exists()
    assert [event["from_epoch"] for event in events(run_dir, "job_restarted")] == [1]
    assert_same_weights(run_dir, weights(tmp_path / "reference"))

    resumed = shoal("train", "--resume", run_dir, "--workers", 3, "--set", "train.epochs=5", "--trust-code",
                    env=project_env, timeout=TIMEOUT)
    assert resumed.returncode == 0, resumed.stderr
    record = events(run_dir, "job_resumed")[-1]
    assert (record["from_epoch"], record["resharded_from"], record["world_size"]) == (4, 2, 3)
    assert events(run_dir, "job_end")[-1]["status"] == "completed"
    last = events(run_dir, "epoch_end")[-1]
    assert last["epoch"] == 5 and len(last["workers"]) == 3
    assert math.isfinite(last["train_loss"])
    assert all(tensor.isfinite().all() for tensor in weights(run_dir).values())
