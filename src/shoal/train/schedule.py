"""Learning-rate schedules: any `torch.optim.lr_scheduler` class by name, stepped as it expects.

`train.scheduler = { name = "StepLR", step_size = 10, gamma = 0.5 }`. OneCycleLR and CyclicLR are
defined in optimizer steps, so they step after every step; the others after every epoch, and
ReduceLROnPlateau with the epoch's training loss over all trainers, which every rank knows after
the epoch's gather, so every rank's rate stays the same. `interval = "step"` or `"epoch"`
overrides. The scheduler's state is part of each rank's checkpoint (see `TrainingState`).
"""

from __future__ import annotations

import difflib
import inspect

import torch
from torch.optim import lr_scheduler

from shoal.errors import ConfigError

PER_STEP = ("OneCycleLR", "CyclicLR")
INTERVALS = ("step", "epoch")
UNUSABLE = {
    "LambdaLR": "it takes a Python function, which a job file cannot hold",
    "MultiplicativeLR": "it takes a Python function, which a job file cannot hold",
    "SequentialLR": "it takes other schedulers",
    "ChainedScheduler": "it takes other schedulers",
    "LRScheduler": "it is the base class",
}


def scheduler_class(name) -> type:
    if not isinstance(name, str):
        raise ConfigError("train.scheduler.name: required, e.g. scheduler = { name = \"StepLR\", step_size = 10 }")
    if name in UNUSABLE:
        raise ConfigError(f"train.scheduler.name: {name!r} cannot be used: {UNUSABLE[name]}")
    known = {cls.__name__: cls for cls in vars(lr_scheduler).values() if inspect.isclass(cls)
             and (issubclass(cls, lr_scheduler.LRScheduler) or cls is lr_scheduler.ReduceLROnPlateau)
             and cls.__name__ not in UNUSABLE}
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"train.scheduler.name: unknown scheduler {name!r}{hint}")
    return known[name]


class Schedule:
    """A scheduler and when it steps."""

    def __init__(self, scheduler, interval: str):
        self.scheduler, self.interval = scheduler, interval
        self.on_loss = isinstance(scheduler, lr_scheduler.ReduceLROnPlateau)

    def after_step(self) -> None:
        if self.interval == "step":
            self.scheduler.step()

    def after_epoch(self, train_loss: float) -> None:
        if self.interval == "epoch":
            self.scheduler.step(train_loss) if self.on_loss else self.scheduler.step()

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)


def make_schedule(options: dict | None, optimizer: torch.optim.Optimizer) -> Schedule | None:
    """The schedule of a `train.scheduler` table (None without one); bad keys are one line naming the key."""
    if options is None:
        return None
    cls = scheduler_class(options.get("name"))
    interval = options.get("interval", "step" if cls.__name__ in PER_STEP else "epoch")
    if interval not in INTERVALS:
        raise ConfigError(f"train.scheduler.interval: must be one of {', '.join(INTERVALS)}, got {interval!r}")
    arguments = {key: value for key, value in options.items() if key not in ("name", "interval")}
    accepted = inspect.signature(cls.__init__).parameters
    for key in arguments:
        if key not in accepted or key in ("self", "optimizer"):
            raise ConfigError(f"train.scheduler.{key}: not an argument of torch.optim.lr_scheduler.{cls.__name__}")
    try:
        return Schedule(cls(optimizer, **arguments), interval)
    except (TypeError, ValueError, KeyError) as error:
        raise ConfigError(f"train.scheduler: {cls.__name__}: {error}") from None
