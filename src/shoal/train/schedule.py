"""Learning-rate schedules: any `torch.optim.lr_scheduler` class by name, or one a function of yours builds.

`train.scheduler = { name = "StepLR", step_size = 10, gamma = 0.5 }`. OneCycleLR and CyclicLR are
defined in optimizer steps, so they step after every step; the others after every epoch, and
ReduceLROnPlateau with the epoch's training loss over all trainers, which every rank knows after
the epoch's gather, so every rank's rate stays the same. `interval = "step"` or `"epoch"`
overrides.

A schedule a table cannot hold (a LambdaLR, a warm-up then a cosine: SequentialLR) is built by a
function: `train.scheduler = { factory = "package.module:function", interval = "epoch" }` (or the file
`shoal.fit(scheduler=...)` writes into the run directory; see `shoal.code`). It is called with the job's
optimizer and returns a scheduler built on it; it steps per epoch unless `interval = "step"`.

The scheduler's state is part of each rank's checkpoint (see `TrainingState`): torch's `state_dict` of a
SequentialLR or ChainedScheduler holds its children's, so a resumed job's rates go on exactly where they were.
"""

from __future__ import annotations

import difflib
import inspect

import torch
from torch.optim import lr_scheduler

from shoal.code import load_code
from shoal.errors import ConfigError, first_line

PER_STEP = ("OneCycleLR", "CyclicLR")
INTERVALS = ("step", "epoch")
BUILD_IT = "give a function that builds it: train.scheduler.factory, or shoal.fit(scheduler=...)"
UNUSABLE = {
    "LambdaLR": f"it takes a Python function, which a job file cannot hold; {BUILD_IT}",
    "MultiplicativeLR": f"it takes a Python function, which a job file cannot hold; {BUILD_IT}",
    "SequentialLR": f"it takes other schedulers; {BUILD_IT}",
    "ChainedScheduler": f"it takes other schedulers; {BUILD_IT}",
    "LRScheduler": "it is the base class",
}
FACTORY_KEYS = ("factory", "interval")
"""What a table with a `factory` holds: the function sets its scheduler's arguments."""


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


def make_schedule(options: dict | None, optimizer: torch.optim.Optimizer, run_dir=None) -> Schedule | None:
    """The schedule of a `train.scheduler` table (None without one); bad keys are one line naming the key. A
    `factory` shipped by value is read from `run_dir`."""
    if options is None:
        return None
    if "factory" in options:
        return factory_schedule(options, optimizer, run_dir)
    cls = scheduler_class(options.get("name"))
    interval = checked_interval(options.get("interval", "step" if cls.__name__ in PER_STEP else "epoch"))
    arguments = {key: value for key, value in options.items() if key not in ("name", "interval")}
    accepted = inspect.signature(cls.__init__).parameters
    for key in arguments:
        if key not in accepted or key in ("self", "optimizer"):
            raise ConfigError(f"train.scheduler.{key}: not an argument of torch.optim.lr_scheduler.{cls.__name__}")
    try:
        return schedule_of(cls(optimizer, **arguments), interval)
    except (TypeError, ValueError, KeyError) as error:
        raise ConfigError(f"train.scheduler: {cls.__name__}: {error}") from None


def factory_schedule(options: dict, optimizer: torch.optim.Optimizer, run_dir) -> Schedule:
    """The schedule of `{ factory = ..., interval = ... }`: the scheduler the function builds on `optimizer`."""
    if "name" in options:
        raise ConfigError("train.scheduler: give either name (a torch scheduler and its arguments) or factory "
                          "(a function that builds one), not both")
    for key in options:
        if key not in FACTORY_KEYS:
            raise ConfigError(f"train.scheduler.{key}: not a key beside train.scheduler.factory, whose function "
                              f"sets its scheduler's arguments; only {' and '.join(FACTORY_KEYS)} are")
    interval = checked_interval(options.get("interval", "epoch"))
    reference = options["factory"]
    function = load_code(reference, "train.scheduler.factory", run_dir)
    if not callable(function):
        raise ConfigError(f"train.scheduler.factory: {reference!r} is a {type(function).__name__}, not a function "
                          "of the optimizer")
    try:
        scheduler = function(optimizer)
    except ConfigError:
        raise
    except Exception as error:  # the user's code: whatever it raises is theirs to read
        raise ConfigError(f"train.scheduler.factory: {reference!r} failed: {type(error).__name__}: "
                          f"{first_line(error)}") from None
    if not isinstance(scheduler, lr_scheduler.LRScheduler | lr_scheduler.ReduceLROnPlateau):
        raise ConfigError(f"train.scheduler.factory: {reference!r} must return a torch.optim.lr_scheduler scheduler, "
                          f"got {type(scheduler).__name__}")
    if scheduler.optimizer is not optimizer:
        raise ConfigError(f"train.scheduler.factory: {reference!r} returned a scheduler of another optimizer: build "
                          "it on the optimizer the function is given")
    return schedule_of(scheduler, interval)


def checked_interval(interval) -> str:
    if interval not in INTERVALS:
        raise ConfigError(f"train.scheduler.interval: must be one of {', '.join(INTERVALS)}, got {interval!r}")
    return interval


def schedule_of(scheduler, interval: str) -> Schedule:
    """ReduceLROnPlateau steps on the epoch's training loss, which a step does not have."""
    if interval == "step" and isinstance(scheduler, lr_scheduler.ReduceLROnPlateau):
        raise ConfigError("train.scheduler.interval: ReduceLROnPlateau steps on the epoch's training loss: "
                          "use interval = \"epoch\"")
    return Schedule(scheduler, interval)
