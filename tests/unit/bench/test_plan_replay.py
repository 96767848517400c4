"""benchmarks.plan_replay: a stored measurement planned again is planned as `benchmarks.plan` planned it."""

from __future__ import annotations

import json

import pytest
from benchmarks import plan_replay
from benchmarks.plan import ALGORITHMS, MODELS, write_job

from shoal.api import resolve_job
from shoal.data.synthetic import synth_digits
from shoal.plan.costs import Link
from shoal.plan.median import median_profile
from shoal.plan.planner import job_shape
from shoal.plan.predict import Layout, predict
from shoal.plan.profile import Compute, Network, Profile, profile_from


def test_a_replayed_row_has_the_shape_the_plan_reads_from_the_benchmarks_job(tmp_path):
    synth_digits(tmp_path / "digits", 300, seed=1)
    for model in MODELS:
        for algorithm in ALGORITHMS:
            job = resolve_job(write_job(tmp_path, tmp_path / "digits", model, algorithm, 128, tmp_path), [])
            row = {"model": model, "algorithm": algorithm, "rows": 300, "batch": 128}
            assert plan_replay.shape_of(row) == job_shape(job)


def profile(step: float, across: float) -> dict:
    compute = Compute(model="m", parameters=31810, threads=1, step_seconds={128: step}, update_seconds=1e-4,
                      copy_seconds_per_byte=1e-10, evaluate_seconds_per_row=1e-6, load_rows_per_second=1e6,
                      startup_seconds=4.0, pace_range=1.2)
    network = Network(across=Link(1e-4, across), inside=Link(1e-5, 1e9), source="test")
    return json.loads(Profile(compute=compute, network=network).to_json())


def test_each_row_is_planned_from_the_median_of_its_links_profiles(tmp_path):
    measured = {"rows": 10_000, "model": "784-40-10", "batch": 128, "measured": 0.5, "error": 0.0}
    result = tmp_path / "2026-01-01-2core-cpu-plan.json"
    result.write_text(json.dumps({"results": [
        {**measured, "rate": "-", "algorithm": "sync", "nodes": 1},  # one host: measured under the first link
        {**measured, "rate": "1gbit", "algorithm": "sync", "nodes": 2},
        *({"profile": profile(step, across), "rate": "1gbit", "model": "784-40-10", "calibration": run}
          for run, (step, across) in enumerate([(1e-3, 1e8), (2e-3, 5e7), (4e-3, 2e7)])),
        {"profile": profile(9e-3, 1e6), "rate": "10mbit", "model": "784-40-10", "calibration": 0}]}))
    rows = plan_replay.replayed(result)
    middle = median_profile([(tmp_path, profile_from(profile(step, across), tmp_path))
                             for step, across in [(1e-3, 1e8), (2e-3, 5e7), (4e-3, 2e7)]])
    for row, nodes in zip(rows, (1, 2)):
        shape = plan_replay.shape_of(row)
        expected = predict(shape, Layout(nodes, 1), middle.compute, middle.network).epoch_seconds
        assert row["replayed"] == pytest.approx(expected) and row["replayed_error"] == pytest.approx(expected / 0.5 - 1)
    assert middle.compute.step_seconds[128] == pytest.approx(2e-3)  # the middle calibration, not the 10 Mbit/s one


def test_a_result_without_profiles_per_calibration_is_left_out(tmp_path):
    result = tmp_path / "2026-01-01-2core-cpu-plan.json"
    result.write_text(json.dumps({"results": [{"profile": profile(1e-3, 1e8), "rate": "1gbit", "model": "x"}]}))
    assert plan_replay.replayed(result) is None


def test_a_row_timed_for_pace_is_also_scored_at_that_pace_with_todays_model(tmp_path):
    measured = {"rows": 10_000, "model": "784-40-10", "batch": 128, "measured": 0.5, "error": 0.0, "rate": "1gbit",
                "algorithm": "sync", "nodes": 2}
    result = tmp_path / "2026-01-01-2core-cpu-plan.json"
    result.write_text(json.dumps({"results": [
        measured, {**measured, "pace": 1.5},
        {"profile": profile(1e-3, 1e8), "rate": "1gbit", "model": "784-40-10", "calibration": 0}]}))
    plain, timed = plan_replay.replayed(result)
    stored = profile_from(profile(1e-3, 1e8), tmp_path)
    now = predict(plan_replay.shape_of(measured), Layout(2, 1), stored.compute, stored.network)
    assert "replayed_error_at_pace" not in plain
    assert timed["replayed_error_at_pace"] == pytest.approx(
        (now.compute_seconds * 1.5 + now.communication_seconds) / 0.5 - 1)
    line = plan_replay.paced({"r": [plain, timed]})
    assert "timed for pace: 1." in line and plan_replay.score([timed["replayed_error_at_pace"]]) in line


def test_a_job_run_after_every_calibration_is_planned_and_measured_again_by_halves(tmp_path):
    steps = [1e-3, 3e-3, 2e-3, 5e-3, 4e-3]  # calibrations in the order run: odd passes 1, 2, 4 ms; even 3, 5 ms
    runs = [0.50, 0.70, 0.52, 0.90, 0.60]  # the job's run after each: odd passes' median 0.52, even ones' 0.80
    measured = {"rows": 10_000, "model": "784-40-10", "batch": 128, "measured": 0.60, "error": 0.0, "rate": "1gbit",
                "algorithm": "sync", "nodes": 2, "runs": runs}
    result = tmp_path / "2026-01-01-2core-cpu-plan.json"
    result.write_text(json.dumps({"results": [
        measured, {**measured, "runs": runs[:3]},  # too few runs to split
        *({"profile": profile(step, 1e8), "rate": "1gbit", "model": "784-40-10", "calibration": run}
          for run, step in enumerate(steps))]}))
    split, unsplit = plan_replay.replayed(result)
    assert "half_predictions" not in unsplit
    assert split["half_measurements"] == [0.52, 0.80]
    for half, chosen in zip(split["half_predictions"], (steps[0::2], steps[1::2])):
        middle = median_profile([(tmp_path, profile_from(profile(step, 1e8), tmp_path)) for step in chosen])
        assert half == pytest.approx(predict(plan_replay.shape_of(measured), Layout(2, 1), middle.compute,
                                             middle.network).epoch_seconds)
    # 0.80 against 0.52 and back: neither half within 15% of the other
    assert plan_replay._agree(split, repeat=True) == 0
    table = plan_replay.against_itself({"r": [split, unsplit]})
    assert "| two hosts, sync | 1 | 0/2 (0%) |" in table and "agree within 15% both ways: 0 of 1" in table


def test_halves_that_agree_count_their_result_as_steady():
    row = {"nodes": 1, "algorithm": "sync", "rate": "-", "half_measurements": [1.0, 1.1],
           "half_predictions": [1.0, 1.5]}
    assert plan_replay._agree(row, repeat=True) == 2 and plan_replay._agree(row, repeat=False) == 1
    table = plan_replay.against_itself({"steady": [row]})
    assert "| one host | 1 | 2/2 (100%) | 1/2 (50%) |" in table and "both ways: 1 of 1 (steady)" in table
