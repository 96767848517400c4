"""benchmarks.pace and the plan benchmark's score at the pace a run's hosts showed."""

from __future__ import annotations

import json

import pytest
from benchmarks import pace
from benchmarks.plan import compared, table, write_job

from shoal.data.synthetic import synth_digits


def test_each_line_is_answered_with_a_step_and_one_probe_serves_a_model_and_its_data(tmp_path, monkeypatch):
    synth_digits(tmp_path / "digits", 300, seed=1)
    sync = write_job(tmp_path, tmp_path / "digits", "784-40-10", "sync", 32, tmp_path)
    downpour = write_job(tmp_path, tmp_path / "digits", "784-40-10", "downpour", 32, tmp_path)
    wider = write_job(tmp_path, tmp_path / "digits", "784-256-10", "sync", 32, tmp_path)
    monkeypatch.setattr(pace, "PACE_SECONDS", 0.02)
    built = []
    original = pace.ComputeProbe
    monkeypatch.setattr(pace, "ComputeProbe", lambda job, threads: built.append(job) or original(job, threads))
    answers = []
    pace.serve([f"{sync} 32\n", f"{downpour} 64\n", f"{wider} 32\n"], answers.append)
    steps = [json.loads(answer)["step"] for answer in answers]
    assert len(steps) == 3 and all(0 < step < 1 for step in steps)
    assert [job.model.layers[0]["dense"] for job in built] == [40, 256]  # sync and downpour share one


def plan(compute: float, communication: float) -> dict:
    return {"epoch_seconds": compute + communication, "compute_seconds": compute,
            "communication_seconds": communication, "pace_range": 1.3, "calibrated_step": 1e-3}


def run(seconds: float, steps: list[float] | None = None) -> dict:
    found = {"seconds": seconds, "communication": 0.5}
    return {**found, "pace_steps": steps} if steps is not None else found


def test_a_prediction_is_scored_at_the_pace_its_median_runs_hosts_showed():
    runs = [run(2.4, [2e-3, 2e-3]), run(2.0, [1.2e-3, 1.4e-3, 1.3e-3, 1.3e-3]), run(1.0, [1e-3, 1e-3])]
    row = compared({"rate": "1gbit"}, plan(compute=1.0, communication=0.5), runs)
    assert row["measured"] == 2.0 and row["error"] == pytest.approx(1.5 / 2.0 - 1)
    assert row["pace"] == pytest.approx(1.3)  # the median run's, over the calibrations' step
    assert row["run_paces"] == pytest.approx([2.0, 1.3, 1.0])
    assert row["error_at_pace"] == pytest.approx((1.0 * 1.3 + 0.5) / 2.0 - 1)  # communication as predicted


def test_runs_without_pace_timings_keep_the_plain_score_and_a_dash_in_the_table():
    row = compared({"rate": "-", "rows": 10, "model": "m", "algorithm": "sync", "batch": 8, "nodes": 1},
                   plan(compute=1.0, communication=0.0), [run(1.0)])
    assert "pace" not in row and "error_at_pace" not in row
    assert table([row]).splitlines()[-1].endswith("| 1.30x | - | - |")
