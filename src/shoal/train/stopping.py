"""Ending a job before its last epoch: `train.stop` and the user's callbacks.

cNeural trains "until the mean square error is below T, or a maximum of epochs"; early stopping
ends a job whose metric has stopped improving. Both are decided on rank 0 (the coordinator), which
holds the epoch's metrics, and every rank learns the decision at the same epoch's end, so no rank
waits in a collective the others have left. The patience count is part of the checkpoint: a
resumed job waits exactly as long as one that ran straight through.

The user's callbacks (`shoal.fit(callbacks=[...])`) live on rank 0 too, each with any of three
hooks: `on_epoch_end(epoch, metrics)`, or `on_epoch_end(epoch, metrics, model)` when it takes three
positional parameters, after each epoch's record (a True return stops the job); `on_step(step, loss)`
after every training step rank 0 takes (none where rank 0 is a parameter server: it serves, the
trainers step); and `on_train_end(metrics, model)` once, after the model is saved (metrics named as
on_epoch_end's: the last epoch's `train_loss`, the latest `test_<name>`). `model` is the consensus
model (what is evaluated and saved: EASGD's centre, not rank 0's replica), lent for the call in eval
mode under torch.no_grad: read it, run it, copy it (copy.deepcopy) to keep it, but do not change it.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from shoal.errors import ConfigError, blamed
from shoal.events import EpochEnd

STOP_KEYS = ("metric", "below", "above", "patience", "min_delta")
HOOKS = ("on_epoch_end", "on_step", "on_train_end")
"""A callback's methods shoal calls; each is optional, and a callback has at least one."""
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
    """What a rule and a callback see of an epoch: `train_loss`, `train_<name>` for what the user's step logged,
    `test_<name>` when it was evaluated, `validation_<name>` for the workers' held-out rows."""
    held_out = {f"validation_{name}": value for name, value in (record.validation or {}).items() if name != "rows"}
    return {"train_loss": record.train_loss, **{f"train_{name}": value for name, value in
                                                (record.train_metrics or {}).items()},
            **{f"test_{name}": value for name, value in record.test.items()}, **held_out}


def takes_model(method: Callable) -> bool:
    """Whether a hook takes the model: on_epoch_end(epoch, metrics, model) rather than (epoch, metrics)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # no signature to read: called as documented first
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


@contextlib.contextmanager
def lent(model: torch.nn.Module | None):
    """`model` in eval mode without gradients for a callback, its mode restored after."""
    if model is None:
        yield None
        return
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


class Callbacks:
    """The user's callbacks, on rank 0; a failure inside one is one line naming its class and hook."""

    def __init__(self, callbacks=()):
        self.callbacks = list(callbacks)
        self.stepping = [callback for callback in self.callbacks if hook(callback, "on_step")]

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def epoch_end(self, epoch: int, metrics: dict[str, float], lend: Callable | None = None) -> list[str]:
        """Tell every callback of the epoch; the reasons of those that ask to stop. `lend`: gives the consensus
        model as a context (`Algorithm.consensus`), entered once, only when a callback takes the model."""
        hearing = [callback for callback in self.callbacks if hook(callback, "on_epoch_end")]
        wanting = lend is not None and any(takes_model(callback.on_epoch_end) for callback in hearing)
        reasons = []
        with lend() if wanting else contextlib.nullcontext() as model:
            for callback in hearing:
                with blamed(f"callbacks: {type(callback).__name__}.on_epoch_end"):
                    if takes_model(callback.on_epoch_end):
                        with lent(model) as lent_model:
                            stop = callback.on_epoch_end(epoch, dict(metrics), lent_model)
                    else:
                        stop = callback.on_epoch_end(epoch, dict(metrics))
                if stop:
                    reasons.append(f"a callback ({type(callback).__name__}) asked to stop")
        return reasons

    def step(self, step: int, loss: float) -> None:
        """After a training step of rank 0's: `step` counts the job's steps from 1 (resumed jobs go on counting)."""
        for callback in self.stepping:
            with blamed(f"callbacks: {type(callback).__name__}.on_step"):
                callback.on_step(step, loss)

    def train_end(self, metrics: dict[str, float], model: torch.nn.Module) -> None:
        """Once, after the last epoch, with the model as saved."""
        for callback in self.callbacks:
            if hook(callback, "on_train_end"):
                with blamed(f"callbacks: {type(callback).__name__}.on_train_end"), lent(model) as lent_model:
                    callback.on_train_end(dict(metrics), lent_model)


def hook(callback, name: str) -> bool:
    return callable(getattr(callback, name, None))


class Stopping:
    """Rank 0's judge: the rule and the callbacks, asked after each epoch's record."""

    def __init__(self, rule: StopRule | None, callbacks):
        """`callbacks`: the user's (a list, or `Callbacks`)."""
        self.rule = rule
        self.callbacks = callbacks if isinstance(callbacks, Callbacks) else Callbacks(callbacks)
        self.best: float | None = None
        self.waited = 0  # epochs since the metric last improved

    def decide(self, epoch: int, metrics: dict[str, float], lend: Callable | None = None) -> str | None:
        """Why the job stops after `epoch` (from 0), or None; every callback hears of every epoch. `lend`: gives
        the consensus model as a context, for callbacks whose on_epoch_end takes it (None: they get None)."""
        reasons = [self._rule_says(metrics), *self.callbacks.epoch_end(epoch, metrics, lend)]
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
