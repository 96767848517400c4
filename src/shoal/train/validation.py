"""Validation during an epoch, on the coordinator, in the background: workers never wait for it.

mpi_learn validates on the master every N updates. Here the coordinator (the server, for
parameter-server algorithms) offers its count of updates (or steps) after each one; when
`train.validate_every` of them or `train.validate_seconds` have passed since the last
validation and none is running, the weights are copied into a second model and a background
thread evaluates that copy on the test set and appends a `validation` event. The serving or
training thread pays only for the copy.

The weights copied are those the algorithm would save at that moment (`Algorithm.consensus()`,
as the epoch's evaluation and the saved model use): EASGD's centre, not rank 0's replica. Where
that model cannot be had on rank 0 alone (model averaging between two averages, when the mean
of the replicas lives on no rank), a validation due waits for the next moment the replicas
agree.

The user's own metrics (`train.metrics`) are computed here too, each stateful one (a torchmetrics
object) a copy of the one each epoch's evaluation uses, so the thread never shares state with the epoch's evaluation. A
failure inside one ends the job at the next step's offer (or the epoch's evaluation), as it would
have at the epoch's end, instead of dying quietly with its thread.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time

import torch

from shoal.algorithms import Algorithm
from shoal.errors import ShoalError
from shoal.events import EventLog, Validation
from shoal.train.objective import Objective, evaluate


class Validator:
    """Background evaluations of snapshots of `model`, every `every` counts or `seconds` seconds."""

    def __init__(self, model: torch.nn.Module, objective: Objective, rows, convert, events: EventLog | None,
                 every: int = 0, seconds: float = 0.0, algorithm: Algorithm | None = None, metrics=None):
        """`algorithm`: the job's, bound to `model`, whose consensus is what gets validated (None: `model`).
        `metrics`: the user's own (`UserMetrics`), for this validator alone (not shared with another thread).
        A test set the user's step evaluates is never validated here (`train.validate_every` is refused then:
        the step would draw from the training's random numbers, in another thread)."""
        self.enabled = bool(every or seconds) and rows is not None and events is not None
        self.model, self.objective, self.rows, self.convert, self.events = model, objective, rows, convert, events
        self.algorithm, self.metrics = algorithm, metrics
        self.failure: ShoalError | None = None  # a user's metric that failed in the thread
        self.every, self.seconds = every, seconds
        self.shadow = copy.deepcopy(model) if self.enabled else None
        self.last_count, self.last_time = 0, time.monotonic()
        self.thread: threading.Thread | None = None
        self.epoch = 0

    @classmethod
    def from_job(cls, job, prepared, model, rows, convert, events, algorithm: Algorithm | None = None,
                 metrics=None) -> Validator:
        return cls(model, prepared.objective, rows, convert, events, job.train.validate_every,
                   job.train.validate_seconds, algorithm, metrics)

    def offer(self, count: int) -> None:
        """Called after each update or step with its count: start a validation if one is due."""
        if not self.enabled:
            return
        self.raise_failure()
        due = (self.every and count - self.last_count >= self.every) or (
            self.seconds and time.monotonic() - self.last_time >= self.seconds)
        if not due or (self.thread is not None and self.thread.is_alive()) or not self.snapshot():
            return
        self.last_count, self.last_time = count, time.monotonic()
        self.thread = threading.Thread(target=self._validate, args=(count,), name="shoal-validation", daemon=True)
        self.thread.start()

    def snapshot(self) -> bool:
        """Copy the model the algorithm would save now into the shadow; False when rank 0 cannot have it now."""
        algorithm = self.algorithm
        if algorithm is not None and not algorithm.holds_consensus():
            return False
        lent = algorithm.consensus() if algorithm is not None else contextlib.nullcontext(self.model)
        with torch.no_grad(), lent as consensus:
            for mine, theirs in zip(self.shadow.state_dict().values(), consensus.state_dict().values()):
                mine.copy_(theirs)
        return True

    def _validate(self, count: int) -> None:
        began = time.perf_counter()
        try:
            with torch.no_grad():
                metrics = evaluate(self.shadow, self.objective, *self.rows, convert=self.convert, metrics=self.metrics)
        except ShoalError as error:  # the user's metric: raised on the training thread, at its next offer
            self.failure = error
            return
        self.events.write(Validation(count=count, test=metrics, seconds=time.perf_counter() - began))

    @contextlib.contextmanager
    def paused(self):
        """Let a running validation finish first (the epoch's own evaluation comes next)."""
        if self.thread is not None:
            self.thread.join()
        self.raise_failure()
        yield

    def raise_failure(self) -> None:
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure

    def close(self) -> None:
        if self.thread is not None:
            self.thread.join()
