"""train.stop and callbacks: thresholds, patience (and its state across a resume), and one-line errors."""

from __future__ import annotations

import pytest

from shoal.errors import ConfigError
from shoal.events import EpochEnd
from shoal.train.stopping import Stopping, epoch_metrics, stop_rule


def judge(table: dict, callbacks=()) -> Stopping:
    return Stopping(stop_rule(table), list(callbacks))


def test_a_threshold_stops_at_the_first_epoch_past_it():
    stopping = judge({"metric": "test_loss", "below": 0.1})
    assert stopping.decide(0, {"train_loss": 0.05, "test_loss": 0.2}) is None
    assert stopping.decide(1, {"train_loss": 0.04}) is None  # not evaluated: not judged
    assert "test_loss 0.09 is below 0.1" in stopping.decide(2, {"test_loss": 0.09})
    assert "above 0.9" in judge({"metric": "test_accuracy", "above": 0.9}).decide(0, {"test_accuracy": 0.95})


def test_patience_counts_epochs_without_improvement_both_ways():
    losses = judge({"metric": "test_loss", "patience": 2, "min_delta": 0.01})
    decisions = [losses.decide(epoch, {"test_loss": value}) for epoch, value in enumerate([1.0, 0.8, 0.795, 0.9])]
    assert decisions[:3] == [None, None, None] and "not improved on 0.8 for 2 epochs" in decisions[3]
    accuracy = judge({"metric": "test_accuracy", "patience": 1})
    assert accuracy.decide(0, {"test_accuracy": 0.7}) is None
    assert accuracy.decide(1, {"test_accuracy": 0.8}) is None  # higher is better for accuracy
    assert accuracy.decide(2, {"test_accuracy": 0.8}) is not None


def test_the_patience_count_resumes_where_it_was():
    straight = judge({"metric": "train_loss", "patience": 3})
    values = [1.0, 0.9, 0.95, 0.96, 0.97]
    straight_decisions = [straight.decide(epoch, {"train_loss": value}) for epoch, value in enumerate(values)]
    first = judge({"metric": "train_loss", "patience": 3})
    for epoch, value in enumerate(values[:3]):
        first.decide(epoch, {"train_loss": value})
    resumed = judge({"metric": "train_loss", "patience": 3})
    resumed.load_state_dict(first.state_dict())
    assert [resumed.decide(epoch, {"train_loss": value}) for epoch, value in enumerate(values[3:], 3)] == \
        straight_decisions[3:]
    assert straight_decisions[-1] is not None


class Recorder:
    def __init__(self, stop_at: int):
        self.seen, self.stop_at = [], stop_at

    def on_epoch_end(self, epoch, metrics):
        self.seen.append((epoch, metrics))
        return epoch == self.stop_at


def test_callbacks_hear_every_epoch_and_may_stop_it():
    recorder = Recorder(stop_at=1)
    stopping = judge(None, [recorder])
    record = EpochEnd(epoch=1, train_loss=0.5, test={"accuracy": 0.9, "loss": 0.3})
    assert stopping.decide(0, epoch_metrics(record)) is None
    assert "Recorder" in stopping.decide(1, epoch_metrics(record))
    assert recorder.seen[0] == (0, {"train_loss": 0.5, "test_accuracy": 0.9, "test_loss": 0.3})


@pytest.mark.parametrize("table, message", [
    ({"below": 0.1}, "train.stop.metric: required"),
    ({"metric": "test_loss"}, "train.stop: give a threshold"),
    ({"metric": "test_loss", "below": "low"}, "train.stop.below: must be a number"),
    ({"metric": "test_loss", "patience": 0}, "train.stop.patience: must be an integer >= 1"),
    ({"metric": "test_loss", "patience": 2, "wait": 1}, "train.stop.wait: unknown key"),
])
def test_a_bad_stop_table_is_one_line_naming_the_key(table, message):
    with pytest.raises(ConfigError, match=message) as raised:
        stop_rule(table)
    assert "\n" not in str(raised.value)
