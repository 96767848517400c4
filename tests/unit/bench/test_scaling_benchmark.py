"""benchmarks.scaling: the test set has the study's 1:1 balance, and accuracy is read against the majority's share."""

from __future__ import annotations

import numpy as np
from benchmarks import scaling

from shoal.bench.study import write_trials
from shoal.data.format import open_dataset


def test_the_test_set_is_sampled_one_to_one(tmp_path):
    test = scaling.write_test_set(tmp_path, pool_rows=20_000)
    counts = np.bincount(open_dataset(str(test)).read_all()[1])
    assert scaling.TEST_RATIO == "1:1"
    assert len(counts) == 2 and counts[0] == counts[1] > 0
    assert scaling.majority_share(test) == 0.5
    assert not (tmp_path / "claims-pool").exists()


def test_a_test_set_of_another_ratio_is_never_reused(tmp_path):
    (tmp_path / "claims-test").mkdir()  # where an older benchmark kept its 1:10 test set
    assert scaling.test_set_path(tmp_path).name == "claims-test-1-1"


def trial(size: str, workers: int, accuracy: float) -> dict:
    return {"size": size, "rows": 100, "workers": workers, "trial": 0, "threads": 1, "cores": 2,
            "train_seconds": 1.0, "test_accuracy": accuracy, "run_dir": "r", "finished": "yes"}


def test_cells_at_the_majoritys_share_are_named():
    trials = [trial("1:1", 1, 0.70), trial("1:1", 1, 0.72), trial("1:10", 2, 10 / 11), trial("1:10", 2, 10 / 11)]
    named = ["1:1 with 1 worker(s): 0.7100", "1:10 with 2 worker(s): 0.9091"]
    assert scaling.not_above_majority(trials, 10 / 11) == named
    assert scaling.not_above_majority(trials, 0.5) == []


def test_the_report_note_shows_the_share_and_warns(tmp_path, capsys):
    test = scaling.write_test_set(tmp_path, pool_rows=20_000)
    write_trials(tmp_path, [trial("1:2000", 4, 0.5), trial("1:1", 1, 0.8)])
    note = scaling.accuracy_note(test, tmp_path)
    assert "always answering the majority class scores 0.5000" in note
    assert "**Warning**" in note and "1:2000 with 4 worker(s): 0.5000" in note and "1:1 with" not in note
    assert "WARNING" in capsys.readouterr().err
