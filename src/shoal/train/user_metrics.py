"""Test metrics of the user's own (`train.metrics`), computed by the coordinator beside the built-in ones.

Accuracy says little on imbalanced data (on claims where 97% are not fraud, 0.97 is what a model
that never says fraud scores), so a job may name its own: F1, PR-AUC, recall at a threshold. They
are computed on rank 0 over the whole test set, the consensus model's outputs, at every evaluation
(each epoch's, `job_end`'s and the background validations), and are logged under their names
wherever `loss` and `accuracy` are: `epoch_end.test`, `job_end.test`, `validation` events, the
CSV, TensorBoard and MLflow loggers, `shoal status`, and `train.stop` as `test_<name>`.

A metric is one of:

- a function `metric(outputs, labels) -> number`, called once with the whole test set;
- an object with `update(outputs, labels)` (called for every evaluation batch), `compute()` and
  `reset()` (called before each evaluation; an object without one starts each evaluation as a copy
  of itself as it was loaded): torchmetrics' metrics are such objects;
- a class of either kind, built with no arguments (`"torchmetrics.classification:BinaryF1Score"`).

What a metric is given: `outputs`, the model's raw outputs (logits, before any sigmoid or softmax),
a float32 tensor on the CPU of shape (rows, outputs); a model with one output gives shape (rows,),
as a loss function gets them. `labels`: the class of each row (int64, shape (rows,)), or the value
of a numeric label (float32). It returns a number, or a tensor of one value.

With torchmetrics, for a one-logit model (binary_cross_entropy), `BinaryF1Score()` and
`BinaryAveragePrecision()` (PR-AUC) take the outputs as they are: a batch with a value outside
[0, 1] is read as logits (the sigmoid applied, then the 0.5 threshold), but one whose values all lie
within [0, 1] as probabilities. Evaluation batches are 8192 rows, and only a last, small one is
likely to be misread; to be exact, give probabilities, with a function:
`binary_f1_score(outputs.sigmoid(), labels)` (from torchmetrics.functional.classification). For a
two-logit model (cross_entropy on two classes), `MulticlassF1Score(num_classes=2)` is the mean of
both classes' F1 (macro), not the positive class's: that is
`binary_f1_score(outputs.softmax(dim=1)[:, 1], labels)`, and PR-AUC
`binary_average_precision(outputs.softmax(dim=1)[:, 1], labels)`. Rank 0 alone computes these
metrics, so shoal turns off torchmetrics' gathering of a metric's state across processes (it would
wait for ranks that never compute). Background validation uses its own copy of each stateful metric:
the two never share state.
"""

from __future__ import annotations

import copy
import inspect
import numbers
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shoal.code import load_code
from shoal.errors import ConfigError, ShoalError, blamed, described
from shoal.train.objective import BUILT_IN_METRICS

STATEFUL = ("update", "compute")
"""The methods that make a metric an object fed batch by batch rather than a function of the whole test set."""


def key(name: str) -> str:
    return f"train.metrics.{name}"


def stateful(metric: Any) -> bool:
    return all(callable(getattr(metric, method, None)) for method in STATEFUL)


def number(value: Any, name: str) -> float:
    """A metric's result as a float: a number, or a tensor or array of one value."""
    if (isinstance(value, torch.Tensor) and value.numel() == 1) or (isinstance(value, np.ndarray) and value.size == 1):
        value = value.item()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    shape = f" of shape {tuple(value.shape)}" if hasattr(value, "shape") else ""
    raise ShoalError(f"{key(name)}: returned a {type(value).__name__}{shape}, not a number (or a tensor of one "
                     "value)")


def computed_here(metric: Any) -> None:
    """Keep a torchmetrics metric from gathering its state across the job's processes when it computes: only
    rank 0 computes, and the other ranks would never answer."""
    parts = metric.modules() if isinstance(metric, torch.nn.Module) else [metric]
    for part in parts:
        if hasattr(part, "sync_on_compute"):
            part.sync_on_compute = False
        if hasattr(part, "_to_sync"):
            part._to_sync = False


def built(loaded: Any, name: str, reference: str) -> Any:
    """The metric a reference names: a class is built with no arguments; anything else must be a function
    or a stateful object."""
    if inspect.isclass(loaded):
        try:
            loaded = loaded()
        except Exception as error:  # whatever the user's constructor raises
            raise ConfigError(f"{key(name)}: {reference!r} is a class that cannot be built with no arguments "
                              f"({described(error)}); name a function or an object instead") from None
    if not (stateful(loaded) or callable(loaded)):
        raise ConfigError(f"{key(name)}: {reference!r} is a {type(loaded).__name__}, not a function of "
                          "(outputs, labels) nor an object with update(outputs, labels) and compute()")
    if stateful(loaded):
        computed_here(loaded)
    return loaded


class UserMetrics:
    """The user's metrics by name, fed one evaluation's batches (`start`, `update`, then `compute`)."""

    def __init__(self, metrics: dict[str, Any]):
        self.metrics = dict(metrics)
        self.pristine = {name: copy.deepcopy(metric) for name, metric in self.metrics.items()
                         if stateful(metric) and not callable(getattr(metric, "reset", None))}
        self.functions = [name for name, metric in self.metrics.items() if not stateful(metric)]
        self.outputs: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.metrics)

    def __bool__(self) -> bool:
        return bool(self.metrics)

    def copy(self) -> UserMetrics:
        """The same metrics, each stateful one copied (copy.deepcopy): for evaluations in another thread."""
        copied = {}
        for name, metric in self.metrics.items():
            with blamed(key(name)):
                copied[name] = copy.deepcopy(metric) if stateful(metric) else metric
        return UserMetrics(copied)

    def start(self) -> None:
        """Before an evaluation: every stateful metric reset, no outputs held."""
        self.outputs, self.labels = [], []
        for name, metric in self.metrics.items():
            if name in self.pristine:
                self.metrics[name] = copy.deepcopy(self.pristine[name])
            elif stateful(metric):
                with blamed(key(name)):
                    metric.reset()

    def update(self, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        """One evaluation batch: to every stateful metric, and held for the functions when there are any."""
        outputs = outputs.detach().float().cpu()
        if outputs.ndim == 2 and outputs.shape[1] == 1:  # one output per row: (rows,), as a loss gets it
            outputs = outputs.reshape(-1)
        labels = labels.detach().cpu()
        if self.functions:
            self.outputs.append(outputs)
            self.labels.append(labels)
        for name, metric in self.metrics.items():
            if stateful(metric):
                with blamed(key(name)):
                    metric.update(outputs, labels)

    def compute(self) -> dict[str, float]:
        """Every metric's value over the batches since `start`."""
        found = {}
        whole = (torch.cat(self.outputs), torch.cat(self.labels)) if self.outputs else (torch.empty(0),) * 2
        for name, metric in self.metrics.items():
            with blamed(key(name)):
                value = metric.compute() if stateful(metric) else metric(*whole)
            found[name] = number(value, name)
        self.outputs, self.labels = [], []
        return found


def load_metrics(table: dict | None, run_dir: str | Path | None) -> UserMetrics:
    """The metrics `train.metrics` names (name -> reference), loaded; a name a built-in metric has is refused."""
    found = {}
    for name, reference in (table or {}).items():
        if name in BUILT_IN_METRICS:
            raise ConfigError(f"{key(name)}: {name!r} is the name of a built-in test metric "
                              f"({', '.join(BUILT_IN_METRICS)}); give yours another name")
        found[name] = built(load_code(reference, key(name), run_dir), name, reference)
    return UserMetrics(found)


def job_metrics(job, run_dir: str | Path | None, test_set: bool, by_step: bool) -> UserMetrics:
    """The job's own test metrics (`train.metrics`), loaded (the launcher checks them so; rank 0 computes them on
    the test set): refused without a test set, or where the user's step evaluates it (`by_step`)."""
    if job.train.metrics and not test_set:
        raise ConfigError("train.metrics: computed on the test set, and the job has none (data.test)")
    if job.train.metrics and by_step:
        raise ConfigError("train.metrics: computed on the model's outputs, and this job's test set is evaluated "
                          "by train.step (shoal cannot read its outputs): log the numbers from your step instead")
    return load_metrics(job.train.metrics, run_dir)
