"""A study's ideal speedup follows the workers that train: a parameter server's ranks do not."""

from __future__ import annotations

import json

import pytest

from shoal.bench.analysis import analyze
from shoal.bench.plots import plot_speedup
from shoal.bench.study import STUDY_FILE, read_trials, trainer_count, write_trials


def test_a_servers_ranks_are_not_trainers():
    assert trainer_count({"algorithm": {"name": "sync"}}, 4) == 4
    assert trainer_count({"algorithm": {"name": "downpour"}}, 4) == 3  # rank 0 serves
    assert trainer_count({"algorithm": {"name": "downpour"}, "cluster": {"groups": 2}}, 7) == 4  # and 2 sub-masters
    assert trainer_count({"algorithm": {"name": "easgd", "synchronous": False}}, 3) == 2
    assert trainer_count({"algorithm": {"name": "easgd", "synchronous": True}}, 3) == 3


def rows(trainers: bool) -> list[dict]:
    """Downpour trials on 2 and 3 workers (1 and 2 trainers), the 3-worker ones twice as fast."""
    found = []
    for workers, seconds in ((2, [4.0, 4.2]), (3, [2.0, 2.1])):
        for trial, value in enumerate(seconds, start=1):
            found.append({"size": "1000", "rows": 1000, "workers": workers, "trial": trial, "threads": 1, "cores": 4,
                          "train_seconds": value, "job_seconds": value, "load_seconds": 0.1, "wall_seconds": value,
                          "compute_seconds": value, "communication_seconds": 0.0, "data_seconds": 0.0,
                          "evaluation_seconds": 0.0, "epochs": 1, "samples_per_second": 1.0, "train_loss": 0.1,
                          "test_loss": None, "test_accuracy": None, "test_auc": None, "run_dir": "r",
                          "finished": "2026-11-22T12:00:00+00:00", "nodes": 1, "hosts": "",
                          **({"trainers": workers - 1} if trainers else {})})
    return found


def test_the_ideal_line_counts_trainers():
    analysis = analyze(rows(trainers=True))
    assert analysis.ideal_speedup(2) == 1.0 and analysis.ideal_speedup(3) == 2.0  # not 3 / 2
    ideal = plot_speedup(analysis).axes[0].lines[0]
    assert list(ideal.get_ydata()) == [1.0, 2.0] and "trainers" in ideal.get_label()


def test_a_collective_study_keeps_the_linear_line():
    found = [row | {"trainers": row["workers"]} for row in rows(trainers=False)]
    analysis = analyze(found)
    assert analysis.ideal_speedup(3) == pytest.approx(1.5)
    assert plot_speedup(analysis).axes[0].lines[0].get_label() == "ideal"


def test_an_older_study_gets_its_trainers_from_its_job(tmp_path):
    write_trials(tmp_path, rows(trainers=False))
    (tmp_path / STUDY_FILE).write_text(json.dumps({"job": {"algorithm": {"name": "downpour"}}}))
    assert [row["trainers"] for row in read_trials(tmp_path)] == [1, 1, 2, 2]
    assert analyze(read_trials(tmp_path)).ideal_speedup(3) == 2.0
