"""Ending a job before its last epoch: `train.stop` and the user's callbacks.

cNeural trains "until the mean square error is below T, or a maximum of epochs"; early stopping
ends a job whose metric has stopped improving. Both are decided on rank 0 (the coordinator), which
holds the epoch's metrics, and every rank learns the decision at the same epoch's end, so no rank
waits in a collective the others have left. The patience count is part of the checkpoint: a
resumed job waits exactly as long as one that ran straight through.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shoal.errors import ConfigError
from shoal.events import EpochEnd

STOP_KEYS = ("metric", "below", "above", "patience", "min_delta")
LOWER_IS_BETTER = ("loss", "rmse")  # a metric whose name holds one of these improves by going down


@dataclass
class StopRule:
    """`train.stop = { metric = "test_loss", below = 0.05 }`, `{ metric = "test_accuracy", above = 0.98 }`
    or `{ metric = "test_loss", patience = 3, min_delta = 0.001 }` (any of them together)."""

    metric: str
    below: float | None = None
    above: float | None = None
    patience: int | None = None
    min_delta: float = 0.0

    @property
    def lower_is_better(self) -> bool:
        return any(word in self.metric for word in LOWER_IS_BETTER)


def stop_rule(table: dict | None) -> StopRule | None:
    """The rule of a `train.stop` table, checked key by key (one line naming the key)."""
    if table is None:
        return None
    for key in table:
        if key not in STOP_KEYS:
            raise ConfigError(f"train.stop.{key}: unknown key; train.stop takes {', '.join(STOP_KEYS)}")
    metric = table.get("metric")
    if not isinstance(metric, str) or not metric:
        raise ConfigError("train.stop.metric: required, e.g. \"test_loss\", \"test_accuracy\" or \"train_loss\"")
    for key in ("below", "above", "min_delta"):
        value = table.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise ConfigError(f"train.stop.{key}: must be a number, got {value!r}")
    patience = table.get("patience")
    if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 1):
        raise ConfigError(f"train.stop.patience: must be an integer >= 1, got {patience!r}")
    if all(table.get(key) is None for key in ("below", "above", "patience")):
        raise ConfigError("train.stop: give a threshold (below or above) and/or a patience")
    return StopRule(metric=metric, below=table.get("below"), above=table.get("above"), patience=patience,
                    min_delta=float(table.get("min_delta", 0.0)))


def epoch_metrics(record: EpochEnd) -> dict[str, float]:
    """What a rule and a callback see of an epoch: `train_loss`, and `test_<name>` when it was evaluated."""
    return {"train_loss": record.train_loss, **{f"test_{name}": value for name, value in record.test.items()}}


class Stopping:
    """Rank 0's judge: the rule and the callbacks, asked after each epoch's record."""

    def __init__(self, rule: StopRule | None, callbacks: list):
        self.rule, self.callbacks = rule, list(callbacks)
        self.best: float | None = None
        self.waited = 0  # epochs since the metric last improved

    def decide(self, epoch: int, metrics: dict[str, float]) -> str | None:
        """Why the job stops after `epoch` (from 0), or None; every callback hears of every epoch."""
        reasons = [self._rule_says(metrics)]
        for callback in self.callbacks:
            if callback.on_epoch_end(epoch, dict(metrics)):
                reasons.append(f"a callback ({type(callback).__name__}) asked to stop")
        return next((reason for reason in reasons if reason), None)

    def _rule_says(self, metrics: dict[str, float]) -> str | None:
        rule = self.rule
        if rule is None or rule.metric not in metrics:  # not evaluated this epoch: nothing to judge
            return None
        value = metrics[rule.metric]
        if rule.below is not None and value < rule.below:
            return f"train.stop: {rule.metric} {value:.6g} is below {rule.below:g}"
        if rule.above is not None and value > rule.above:
            return f"train.stop: {rule.metric} {value:.6g} is above {rule.above:g}"
        return self._patience_says(value)

    def _patience_says(self, value: float) -> str | None:
        rule = self.rule
        if rule.patience is None:
            return None
        gain = (self.best - value if rule.lower_is_better else value - self.best) if self.best is not None else None
        if gain is None or gain > rule.min_delta:
            self.best, self.waited = value, 0
            return None
        self.waited += 1
        if self.waited >= rule.patience:
            return f"train.stop: {rule.metric} has not improved on {self.best:.6g} for {self.waited} epochs"
        return None

    def state_dict(self) -> dict:
        return {"best": self.best, "waited": self.waited}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.waited = state.get("best"), state.get("waited", 0)
