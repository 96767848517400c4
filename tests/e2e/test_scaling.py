"""`shoal bench scaling` end to end: a tiny grid of real jobs, interrupted and resumed, then its report.

The bad-input cases need no process; the grid test runs 2 sizes x 2 worker counts x 2 trials
of a one-epoch job, stops the study with SIGINT part way through and reruns the same command.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from shoal.cli import main
from shoal.data.format import DatasetWriter
from tests.e2e.jobs import write_job

ROOT = Path(__file__).resolve().parents[2]
PLOTS = ("time_by_size.png", "time_by_workers.png", "boxes.png", "speedup.png", "split.png")


@pytest.fixture
def claims_job(tmp_path) -> Path:
    """A job on 900 rows, 100 of them the rare class (ratios 1:2 and 1:8 give 300 and 900 rows)."""
    generator = np.random.default_rng(0)
    for name, rows in (("train", 900), ("test", 200)):
        features = generator.normal(size=(rows, 6)).astype(np.float32)
        labels = np.zeros(rows, dtype=np.int64)
        labels[: rows // 9] = 1
        features[labels == 1, 0] += 2.0
        with DatasetWriter(str(tmp_path / name), (6,), "float32", row_group_size=300) as writer:
            writer.write(features, labels)
    return write_job(tmp_path / "job.toml", tmp_path / "train", tmp_path / "test", algorithm="sync", epochs=1,
                     model='layers = [{ dense = 8, activation = "relu" }, { dense = 2 }]')


def trials(out: Path) -> list[dict]:
    path = out / "trials.csv"
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def study_command(job: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "shoal", "bench", "scaling", str(job), "--ratios", "1:2,1:8", "--workers", "1,2",
            "--trials", "2", "--out", str(out), "--no-progress"]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_tiny_grid_runs_resumes_after_an_interrupt_and_reports(claims_job, tmp_path):
    out = tmp_path / "study"
    command = study_command(claims_job, out)
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while len(trials(out)) < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert process.poll() is None, process.communicate()
        time.sleep(1.0)  # into the next trial's launch, or its training
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert "run the same command to go on" in err or "interrupted" in err
    before = trials(out)
    assert 2 <= len(before) < 8
    kept = sorted(str(path.relative_to(out)) for path in (out / "runs").glob("*/*"))
    assert kept == sorted(row["run_dir"] for row in before)  # the interrupted trial left nothing

    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    rows = trials(out)
    assert rows[: len(before)] == before  # finished trials were skipped, not redone
    assert sorted((row["size"], row["workers"], row["trial"]) for row in rows) == sorted(
        (size, workers, trial) for size in ("1:2", "1:8") for workers in "12" for trial in "12")
    assert {row["size"]: int(row["rows"]) for row in rows} == {"1:2": 300, "1:8": 900}
    for row in rows:
        assert float(row["train_seconds"]) > 0 and float(row["wall_seconds"]) > float(row["train_seconds"])
        parts = sum(float(row[f"{part}_seconds"]) for part in ("compute", "communication", "data"))
        assert parts <= float(row["train_seconds"]) * 1.05  # the split accounts for the training time
        assert (float(row["communication_seconds"]) > 0) == (row["workers"] == "2")
        assert row["cores"] == str(len(os.sched_getaffinity(0))) and 0 <= float(row["test_accuracy"]) <= 1
    report = (out / "report.md").read_text()
    assert "| 1:2 | 300 | workers | 1 |" in report and "| 1:8 | 900 | Residuals | 2 |" in report
    assert "## Table 2" in report and "| 2 | 1 |" in report
    for name in PLOTS:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert [line.split(",")[2] for line in (out / "anova.csv").read_text().splitlines()[1:]] == [
        "workers", "Residuals", "workers", "Residuals"]
    study = json.loads((out / "study.json").read_text())
    assert study["seed"] == 0 and study["machine"]["cores"] == len(os.sched_getaffinity(0))


def run(argv: list[str], capsys) -> tuple[int, str]:
    status = main(argv)
    return status, capsys.readouterr().err


def test_bad_study_requests_exit_2_and_leave_nothing(claims_job, tmp_path, capsys):
    out = tmp_path / "study"
    base = ["bench", "scaling", str(claims_job), "--out", str(out), "--workers", "1,2"]
    cases = [
        (["--sizes", "abc"], "--sizes 'abc': expected row counts"),
        (["--sizes", "100", "--workers", "0"], "--workers '0'"),
        (["--sizes", "100", "--trials", "0"], "--trials: must be at least 1"),
        (["--sizes", "5000"], "--sizes: 5,000 rows asked for, but data.train"),
        (["--ratios", "1:x"], "--ratios '1:x'"),
        (["--ratios", "1:20"], "ratio 1:20 needs 2,000 majority rows"),
        (["--sizes", "3", "--workers", "4"], "size 3 (3 rows) with 4 workers: data.train:"),
    ]
    for options, culprit in cases:
        status, err = run(base + options, capsys)
        assert status == 2 and culprit in err and err.startswith("shoal: error: ") and err.count("\n") == 1, err
        assert not out.exists(), options
    out.mkdir()
    (out / "study.json").write_text(json.dumps({"job": {"name": "other"}, "train": "x", "fingerprint": "y",
                                                "seed": 0}))
    status, err = run(base + ["--sizes", "100"], capsys)
    assert status == 2 and f"{out / 'study.json'}: this folder holds a study with another job" in err
    assert sorted(os.listdir(out)) == ["study.json"]
    status, err = run(["bench", "report", str(tmp_path)], capsys)
    assert status == 2 and "not a scaling study folder" in err


@pytest.mark.timeout(120)
def test_a_failing_trial_stops_the_study_naming_it_and_keeps_its_run(claims_job, tmp_path, capsys):
    job = write_job(tmp_path / "failing.toml", tmp_path / "train", None, algorithm="sync", epochs=1,
                    model='factory = "tests.support.models:failing_on_rank_one"\narguments = { features = 6 }')
    out = tmp_path / "study"
    status, err = run(["bench", "scaling", str(job), "--ratios", "1:8", "--workers", "2", "--trials", "1",
                       "--out", str(out), "--no-progress"], capsys)
    run_dir = out / "runs" / "1-8" / "w2-t1"
    assert status == 2 and err.count("\n") == 1, err  # a factory's failure is the job's own: exit 2
    assert f"size 1:8, 2 workers, trial 1 (run directory {run_dir}): worker rank 1" in err
    assert "rank one refuses to build its model" in err
    assert (run_dir / "events.jsonl").exists() and not (out / "trials.csv").exists()
