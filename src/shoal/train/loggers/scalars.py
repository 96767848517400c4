"""The run's records as named scalars: the one translation every logger writes.

TensorBoard and MLflow take what this module gives (the CSV file takes the same epoch values),
so no logger can show a number that events.jsonl does not hold. Epoch values are at the epoch
(numbered from 1), a validation at its count of steps or server updates, a progress loss at
the global step: numbers that go on growing when a job resumes, so curves continue. An epoch's
world size is the one its attempt started with (`WorldSize`): in a job whose machines change it
changes between epochs. Each param group's learning rate is `lr` where the optimizer has one group, `lr/group0`,
`lr/group1`... where it has several (in the CSV file, `lr` or `lr.group0`...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shoal.events import EpochEnd, Event, JobEnd, JobStart, Membership, Progress, Validation

WORLD_SIZE = "cluster/world_size"
LEARNING_RATE = "lr"


@dataclass
class Scalars:
    step: int
    values: dict[str, float]
    time: float | None = None
    """When the record was written (unix seconds)."""


class WorldSize:
    """The world size of the attempt whose records a logger is given: job_start's or job_resumed's, or the
    membership record's that comes before them."""

    def __init__(self):
        self.value: int | None = None

    def follow(self, event: Event) -> None:
        if isinstance(event, JobStart | Membership) and event.world_size:
            self.value = event.world_size


def scalars(event: Event, world_size: int | None = None) -> Scalars | None:
    """The scalars a record stands for; None for a record with none. `world_size`: the epoch's attempt's,
    when known."""
    if isinstance(event, EpochEnd):
        return Scalars(event.epoch, epoch_values(event, world_size), event.time)
    if isinstance(event, Validation):
        return Scalars(event.count, prefixed(Validation.kind, event.test), event.time)  # validation/accuracy
    if isinstance(event, Progress) and event.loss is not None:
        return Scalars(event.step, {"progress/loss": event.loss}, event.time)
    if isinstance(event, JobEnd) and event.test:
        return Scalars(event.epochs or 0, prefixed("final", event.test), event.time)
    return None


def epoch_values(event: EpochEnd, world_size: int | None = None) -> dict[str, float]:
    """An epoch's train loss, test metrics, throughput, time split, the algorithm's numbers, what the user's step
    logged, the held-out rows' metrics, each param group's learning rate and the world size it trained on (when
    known)."""
    values = {"train/loss": event.train_loss, **prefixed("test", event.test),
              "throughput/samples_per_second": event.samples_per_second, "time/epoch": event.seconds}
    values.update(prefixed("time", event.seconds_split.parts()))
    values.update(prefixed("algorithm", flat(event.algorithm or {})))
    values.update(prefixed("train", event.train_metrics or {}))  # the user's step's numbers: train/penalty
    values.update(prefixed("held_out", event.validation or {}))  # validation/ is the background validation's
    values.update(learning_rates(event))
    if world_size:
        values[WORLD_SIZE] = float(world_size)
    return values


def learning_rates(event: EpochEnd, separator: str = "/") -> dict[str, float]:
    """Each param group's learning rate as the epoch began: `lr` for one group, `lr/group0`, `lr/group1`... for
    several (`separator` joins the parts: the CSV file's columns are dotted); none in an older run's record."""
    rates = event.learning_rates or []
    if len(rates) == 1:
        return {LEARNING_RATE: float(rates[0])}
    return {f"{LEARNING_RATE}{separator}group{index}": float(rate) for index, rate in enumerate(rates)}


def prefixed(prefix: str, values: dict) -> dict[str, float]:
    return {f"{prefix}/{name}": float(value) for name, value in values.items()}


def flat(table: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of a nested table, keyed by their path (`staleness/mean`); other values are left out."""
    found = {}
    for key, value in table.items():
        if isinstance(value, dict):
            found.update(flat(value, f"{prefix}{key}/"))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            found[f"{prefix}{key}"] = float(value)
    return found


def parameters(event: JobStart) -> dict[str, str | int | float | bool]:
    """The job's settings as hyperparameters: the resolved job file flattened (`train.optimizer.lr`),
    and where it ran (`run.world_size`); lists as their text."""
    found = {}

    def visit(table: dict, prefix: str) -> None:
        for key, value in table.items():
            if isinstance(value, dict):
                visit(value, f"{prefix}{key}.")
            elif value is not None:
                found[f"{prefix}{key}"] = plain(value)

    visit(event.config, "")
    visit({"world_size": event.world_size, "trainers": event.trainers, "device": event.device,
           "parameters": event.parameters, "train_rows": event.train_rows, "test_rows": event.test_rows,
           "steps_per_epoch": event.steps_per_epoch}, "run.")
    return found


def plain(value) -> str | int | float | bool:
    if isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return str(value)
