"""Your own training step (`train.step`, `shoal.fit(step=...)`): what a batch's loss is, in your code.

shoal's loop calls `forward` and the job's loss; a step of the user's own replaces just that part,
`step(model, batch) -> loss` (or a dict with "loss" and other numbers to log), with the batch as the
data yields it (an `(inputs, labels)` tuple, or a dict of fields). The loop keeps everything
around it (backward, accumulation, clipping, precision, the algorithm's hooks and exchange), so
every algorithm trains a custom step as it trains its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from shoal.code import load_code
from shoal.data.loader import owned
from shoal.errors import ConfigError, blamed
from shoal.train.objective import EVALUATE_ROWS, evaluate

KEY = "train.step"
EVALUATION_SEED = 0
"""Seeds the generators a step's evaluation draws from (forked from the training's)."""


class Step:
    """The user's step function, with its result checked: a one-element loss tensor that autograd can
    differentiate, and logged values that are numbers."""

    def __init__(self, function: Callable, key: str = KEY):
        if not callable(function):
            raise ConfigError(f"{key}: expected a function of (model, batch), got {type(function).__name__}")
        self.function, self.key = function, key

    def __call__(self, model: torch.nn.Module, batch) -> tuple[torch.Tensor, dict[str, float]]:
        """The batch's loss and the other numbers the step returned."""
        with blamed(self.key):
            result = self.function(model, batch)
        return self.split(result)

    def split(self, result) -> tuple[torch.Tensor, dict[str, float]]:
        logged = {}
        if isinstance(result, dict):
            if "loss" not in result:
                raise ConfigError(f"{self.key}: returned a dict without \"loss\" (keys: "
                                  f"{', '.join(map(str, result))})")
            logged = {str(name): number(self.key, name, value) for name, value in result.items() if name != "loss"}
            result = result["loss"]
        if not (isinstance(result, torch.Tensor) and result.numel() == 1):
            what = f"a tensor of shape {list(result.shape)}" if isinstance(result, torch.Tensor) else \
                type(result).__name__
            raise ConfigError(f"{self.key}: must return the loss (a one-element tensor) or a dict with "
                              f"\"loss\", got {what}")
        return result.reshape(()), logged


def number(key: str, name, value) -> float:
    """A logged value as a float: a number or a one-element tensor."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise ConfigError(f"{key}: {name!r} must be a number or a one-element tensor, got "
                      f"{type(value).__name__}")


def load_step(reference: str | None, run_dir) -> Step | None:
    """The job's step (None without one): its code is imported or read from the run directory."""
    return None if reference is None else Step(load_code(reference, KEY, run_dir))


class Logged:
    """The numbers a step logs over an epoch: each one's sum over rows, and the rows it was given for."""

    def __init__(self):
        self.sums: dict[str, list[float]] = {}

    def add(self, values: dict[str, float], rows: int) -> None:
        for name, value in values.items():
            total = self.sums.setdefault(name, [0.0, 0.0])
            total[0] += value * rows
            total[1] += rows

    def take(self) -> dict[str, list[float]]:
        """The epoch's sums, and a fresh start for the next."""
        sums, self.sums = self.sums, {}
        return sums


def combined(per_rank: list[dict[str, list[float]]]) -> dict[str, float]:
    """The row-weighted mean of each logged number over every training rank's sums."""
    totals: dict[str, list[float]] = {}
    for sums in per_rank:
        for name, (value, rows) in sums.items():
            total = totals.setdefault(name, [0.0, 0.0])
            total[0] += value
            total[1] += rows
    return {name: value / rows if rows else math.nan for name, (value, rows) in sorted(totals.items())}


@torch.no_grad()
def evaluate_by_step(model: torch.nn.Module, step: Step, batches) -> dict[str, float]:
    """The step's loss and logged numbers over `batches` (what the loader's converter gives for the rows), the
    model in eval mode: the test metrics of a model whose outputs shoal cannot read itself (dict rows, or a
    model that returns more than the loss takes)."""
    was_training = model.training
    model.eval()
    devices = sorted({parameter.device.index or 0 for parameter in model.parameters() if parameter.is_cuda})
    # a step may draw (sampling, masking): from generators of its own, so that evaluating never moves the
    # training's draws (a resume, or another eval_every, keeps the weights) and draws the same every time
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(EVALUATION_SEED)
        try:
            return by_step(model, step, batches)
        finally:
            model.train(was_training)


def by_step(model: torch.nn.Module, step: Step, batches) -> dict[str, float]:
    """The step's loss and logged numbers, each a mean over the rows."""
    logged, loss_sum, rows = Logged(), 0.0, 0
    for batch, count in batches:  # the rows are the caller's to keep (the test set): the step gets a copy
        loss, values = step(model, owned(batch))
        loss_sum += float(loss) * count
        rows += count
        logged.add(values, count)
    return {"loss": loss_sum / rows} | combined([logged.take()])


def evaluate_rows(model: torch.nn.Module, objective, step: Step | None, features, labels, convert,
                  batch_size: int = EVALUATE_ROWS, **options) -> dict[str, float]:
    """Metrics of the model on rows held in memory: the loss's and the built-in metrics where shoal reads the
    model's outputs itself (`step` None), else the user's step's loss and logged numbers. `options` go to
    `objective.evaluate` (the user's metrics)."""
    if step is None:
        return evaluate(model, objective, features, labels, convert, batch_size, **options)
    batches = ((convert(features[start: start + batch_size], labels[start: start + batch_size]),
                len(features[start: start + batch_size])) for start in range(0, len(features), batch_size))
    return evaluate_by_step(model, step, batches)
