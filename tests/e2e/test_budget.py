"""A job whose share is larger than the worker's memory budget: bounded memory, same accuracy.

Cache reuse across runs is tested on the loader itself (tests/unit/data/test_cache.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from shoal.data.synthetic import synth_digits
from shoal.events import read_events
from tests.e2e.jobs import write_job

TIMEOUT = 240
TRAIN_ROWS = 80_000  # 784 uint8 features: a 63 MB share for one worker
BUDGET = 16_000_000  # about a quarter of the share
# What a worker may add to its memory beyond the budget while it loads and trains: Arrow's read
# buffers for a few 16 MB row groups, one batch, the model, and the small test set.
OVERHEAD = 96_000_000
# The budget bounds the data in host memory. On a GPU the worker's peak also holds the pages of the CUDA libraries
# that its first steps load (an H200 with the GPU image's torch 2.11 added 328 MB, against 89 MB on the CPU): not the
# data's.
ON_THE_CPU = ("--set", "cluster.device='cpu'")

DIGITS_MODEL = 'input = [784]\nlayers = [{ dense = 40, activation = "sigmoid" }, { dense = 10 }]'


def train(job, run_dir, env, *options) -> list[dict]:
    finished = subprocess.run([sys.executable, "-m", "shoal", "train", str(job), "--run-dir", str(run_dir),
                               *options], capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert finished.returncode == 0, finished.stderr
    return list(read_events(run_dir))


def one(events: list[dict], kind: str) -> dict:
    return next(e for e in events if e["event"] == kind)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits")
    synth_digits(str(folder / "train"), TRAIN_ROWS, seed=1)
    synth_digits(str(folder / "test"), 2_000, seed=2)
    return folder / "train", folder / "test"


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT)
def test_a_share_four_times_the_budget_trains_within_it_to_the_same_accuracy(digits, tmp_path, project_env):
    job = write_job(tmp_path / "job.toml", *digits, algorithm="none", model=DIGITS_MODEL,
                    extra="[checkpoint]\nevery = 0")
    sgd = '{ name = "sgd", lr = 0.5, momentum = 0.9 }'
    text = job.read_text().replace('{ name = "adam", lr = 0.003 }', sgd)
    job.write_text(text.replace("batch_size = 64", "batch_size = 128"))
    plain = train(job, tmp_path / "plain", project_env, "--workers", "1", *ON_THE_CPU)
    budgeted = train(job, tmp_path / "budgeted", project_env, "--workers", "1", *ON_THE_CPU,
                     "--set", f"data.memory_per_worker={BUDGET}")

    share = one(budgeted, "data_loaded")["shares"][0]
    assert share["mode"] == "cache" and share["sub_partitions"] >= 4 and share["cache_reused"] is False
    assert one(plain, "data_loaded")["shares"][0]["mode"] == "memory"

    share_bytes = TRAIN_ROWS * 784
    plain_memory = one(plain, "job_end")["memory"][0]
    budget_memory = one(budgeted, "job_end")["memory"][0]
    assert plain_memory["peak"] - plain_memory["before_data"] >= share_bytes  # the measure sees a whole share
    added = budget_memory["peak"] - budget_memory["before_data"]
    assert added <= BUDGET + OVERHEAD, f"the budgeted worker added {added:,} bytes"

    plain_accuracy = one(plain, "job_end")["test"]["accuracy"]
    budget_accuracy = one(budgeted, "job_end")["test"]["accuracy"]
    assert plain_accuracy > 0.9
    assert abs(budget_accuracy - plain_accuracy) <= 0.015, (plain_accuracy, budget_accuracy)
