"""A study's report with a plan's profile: each cell's prediction beside its measurement."""

from __future__ import annotations

import json

import pytest

from shoal.api import resolve_job
from shoal.bench.report import write_report
from shoal.bench.study import STUDY_FILE, write_trials
from shoal.plan.calibrate import model_key_of
from shoal.plan.costs import Link
from shoal.plan.planner import job_shape
from shoal.plan.predict import Layout, predict
from shoal.plan.profile import Compute, Network, Profile
from tests.distributed.common import write_dataset


def write_study(folder, train) -> dict:
    job = {"name": "study", "model": {"layers": [{"dense": 8, "activation": "tanh"}, {"dense": 3}]},
           "data": {}, "algorithm": {"name": "averaging"}, "train": {"epochs": 2, "batch_size": 16},
           "cluster": {"threads": 1}}
    folder.mkdir()
    (folder / STUDY_FILE).write_text(json.dumps({"job": job, "train": str(train), "fingerprint": {}, "seed": 0}))
    rows = [{"size": "300", "rows": 300, "workers": workers, "trial": trial, "threads": 1, "cores": 2,
             "train_seconds": 0.5 / workers + 0.01 * trial, "job_seconds": 1.0, "load_seconds": 0.1,
             "wall_seconds": 6.0, "compute_seconds": 0.1, "communication_seconds": 0.0, "data_seconds": 0.0,
             "evaluation_seconds": 0.0, "epochs": 2, "samples_per_second": 1.0, "train_loss": 1.0,
             "run_dir": "x", "finished": "now", "nodes": 1, "hosts": ""}
            for workers in (1, 2) for trial in (1, 2, 3)]
    write_trials(folder, rows)
    return {**job, "data": {"train": str(train)}}  # as it trains: study.json leaves data.train out


def test_the_report_sets_each_cells_prediction_beside_its_mean(tmp_path):
    write_dataset(tmp_path / "train", rows=300)
    job = resolve_job(write_study(tmp_path / "study", tmp_path / "train"), [])
    compute = Compute(model=model_key_of(job), parameters=0, threads=1, step_seconds={16: 0.001},
                      update_seconds=0.0, copy_seconds_per_byte=0.0, evaluate_seconds_per_row=0.0,
                      load_rows_per_second=1e5, startup_seconds=4.0)
    profile = Profile(compute=compute, network=Network(across=Link(1e-4, 1e8), inside=Link(1e-5, 1e9), source="t"))
    text = write_report(tmp_path / "study", profile=profile).read_text()
    expected = 2 * predict(job_shape(job, 300), Layout(1, 2), compute, profile.network).epoch_seconds
    row = next(line for line in text.splitlines() if line.startswith("| 300 | 300 | 2 | 1 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert float(cells[4]) == pytest.approx(0.27, abs=1e-3)  # the mean of the 2-worker trials: 0.25 + 0.02
    assert float(cells[5]) == pytest.approx(expected, abs=1e-3)
    assert float(cells[6]) == pytest.approx(expected / 0.27, abs=0.01)


def test_a_study_whose_data_is_gone_says_so_in_one_line(tmp_path):
    write_dataset(tmp_path / "train", rows=300)
    write_study(tmp_path / "study", tmp_path / "absent")
    profile = Profile(compute=Compute(model="m", parameters=0, threads=1, step_seconds={16: 0.001}, update_seconds=0.0,
                                      copy_seconds_per_byte=0.0, evaluate_seconds_per_row=0.0,
                                      load_rows_per_second=1e5, startup_seconds=4.0),
                      network=Network(across=Link(1e-4, 1e8), inside=Link(1e-5, 1e9), source="t"))
    text = write_report(tmp_path / "study", profile=profile).read_text()
    assert "No prediction: " in text and "absent" in text


def test_a_bad_profile_is_refused_before_a_study_starts(tmp_path, capsys):
    from shoal.cli import main

    (tmp_path / "bad.json").write_text("{}")
    assert main(["bench", "report", str(tmp_path), "--profile", str(tmp_path / "bad.json")]) == 2
    assert "bad.json: format" in capsys.readouterr().err
