"""A user's own training code, named in job files as 'tests.support.own_code:NAME' (train.step, data.transform,
train.scheduler.factory, train.metrics): what `shoal train` imports in every worker."""

from __future__ import annotations

import torch
from torch.nn import functional


def step(model, batch):
    """Cross-entropy plus a small penalty on the logits, both logged."""
    inputs, labels = batch
    logits = model(inputs)
    penalty = 1e-3 * logits.pow(2).mean()
    return {"loss": functional.cross_entropy(logits, labels) + penalty, "penalty": penalty}


def jitter(batch):
    """Noise on the inputs, drawn anew every epoch."""
    inputs, labels = batch
    return inputs + 0.05 * torch.randn_like(inputs), labels


def warm_up(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))


def positives(outputs, labels):
    """The share of the test rows predicted as the second class."""
    return float((outputs.argmax(dim=1) == 1).float().mean())


def regression(model, batch):
    """A step on a numeric label: the mean absolute error."""
    inputs, labels = batch
    return (model(inputs).reshape(-1) - labels).abs().mean()


def broken_step(model, batch):
    """A step whose own code fails on its first batch: its traceback must reach the user."""
    inputs, labels = batch
    return shape_of_nothing(inputs)


def shape_of_nothing(inputs):
    raise ValueError("my step is broken")
