"""A trial that finished keeps its row in trials.csv even when Ctrl-C is raised as its row is recorded."""

from __future__ import annotations

import pytest

from shoal.bench import study
from shoal.bench.study import read_trials, record_trial


def row(trial: int) -> dict:
    return {"size": "1:1", "rows": 100, "workers": 1, "trial": trial, "threads": 1, "cores": 2,
            "train_seconds": 1.0, "test_accuracy": 0.5, "run_dir": f"runs/1-1/w1-t{trial}", "finished": "yes"}


def test_ctrl_c_as_the_row_is_written_keeps_the_row(tmp_path, monkeypatch):
    done = [row(1)]
    study.write_trials(tmp_path, done)
    write = study.write_trials
    calls = []

    def interrupted_once(out, rows):  # as when SIGINT arrived just before the block that defers it
        calls.append(len(rows))
        if len(calls) == 1:
            raise KeyboardInterrupt
        write(out, rows)

    monkeypatch.setattr(study, "write_trials", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        record_trial(tmp_path, done, lambda: row(2))
    assert [item["trial"] for item in read_trials(tmp_path)] == [1, 2] and calls == [2, 2]


def test_a_trial_stopped_before_its_row_adds_nothing(tmp_path):
    done = [row(1)]
    study.write_trials(tmp_path, done)

    def stopped():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        record_trial(tmp_path, done, stopped)
    assert done == [row(1)] and [item["trial"] for item in read_trials(tmp_path)] == [1]
