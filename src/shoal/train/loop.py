"""The training loop: an ordinary PyTorch loop with the algorithm's hooks around it.

A step of the user's own (`train.step`) may replace the forward pass and the loss, and a transform
(`data.transform`) change each batch first; the loop keeps the rest. The loop knows nothing about
distribution; it times each part of a step so that every epoch reports where its time went: data
(batch slicing and conversion), communication (whatever the algorithm's collectives took) and
compute (forward, backward and update). It also tells (`on_phase`) when it fetches a batch and when
it trains on it, for the stall inspector (shoal.cluster.inspector), which never takes a rank that
reads data for stuck.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING

import torch

from shoal.algorithms.base import Algorithm
from shoal.cluster.collectives import Communicator
from shoal.cluster.inspector import TRAIN
from shoal.data.balance import nominal_crossed
from shoal.data.loader import ShardLoader, batch_rows, owned
from shoal.errors import ShoalError, UserCodeError
from shoal.train.objective import Objective
from shoal.train.schedule import Schedule
from shoal.train.step import Logged, Step
from shoal.train.transform import ModelInputs, misshapen

if TYPE_CHECKING:
    from shoal.train.transform import Transform


LOADING = "loading"
"""The phase of a rank that reads data: here, while it fetches the next batch."""


class NumericalError(ShoalError):
    """The loss became NaN or infinite."""


@dataclass
class EpochStats:
    """One rank's account of one epoch."""

    rows: float = 0.0
    loss_sum: float = 0.0
    compute: float = 0.0
    communication: float = 0.0
    data: float = 0.0
    steps: float = 0.0
    seconds: float = 0.0
    reading: float = 0.0
    """Of `data`: re-reading rows for a share that moved at the epoch's start (not the worker's pace)."""

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor(astuple(self), dtype=torch.float64)

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> EpochStats:
        return cls(*tensor.tolist())


class Trainer:
    """Runs epochs of one worker's share through the model; owns its counters (step, epoch).

    With `accumulate` (batches per update, or None for one), each batch's gradient is summed in,
    weighted by its rows, and the sum becomes one mean gradient, one exchange and one optimizer step:
    over a whole share it is the full-batch step of cNeural's batch mode. `precision` "bf16" runs the
    forward pass under autocast; the loss is computed in fp32.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, objective: Objective,
                 algorithm: Algorithm, loader: ShardLoader, comm: Communicator, *, on_step=None,
                 schedule: Schedule | None = None, clip_norm: float | None = None, accumulate: int | None = None,
                 precision: str = "fp32", step: Step | None = None, transform: Transform | None = None,
                 on_phase=None):
        """`step`: the user's own training step in place of forward and loss; `transform`: the user's
        function applied to every batch before it (both optional). `on_phase`: told LOADING as a batch is
        fetched, TRAIN as the step on it begins (the heartbeat's `enter_phase`)."""
        self.model, self.optimizer, self.objective = model, optimizer, objective
        self.step, self.transform = step, transform
        self.private = step is not None or transform is not None  # the user's code sees the batches
        self.logged = Logged()  # the numbers the user's step logs, summed over the epoch
        self.schedule, self.clip_norm, self.accumulate = schedule, clip_norm, accumulate
        self.algorithm, self.loader, self.comm = algorithm, loader, comm
        self.on_step = on_step  # called with the step's loss (the progress bar)
        self.on_phase = on_phase or (lambda phase: None)
        self.global_step = 0  # steps taken, across epochs
        self.epoch = 0  # the epoch in progress (or last run), from 0
        self.step_in_epoch = 0  # steps taken in it
        self.synchronize = (lambda: torch.cuda.synchronize()) if loader.device.type == "cuda" else (lambda: None)
        self.autocast = (functools.partial(torch.autocast, loader.device.type, dtype=torch.bfloat16)
                         if precision == "bf16" else contextlib.nullcontext)  # fp32 steps enter nothing
        self.group_rows = 0  # rows whose gradients are summed in, not yet applied
        self.shapes_checked = not self.private  # the first batch the user's code made is checked (first_learn)

    def train_epoch(self, epoch: int) -> EpochStats:
        self.epoch = epoch
        stats = EpochStats()
        self.model.train()
        began = time.perf_counter()
        communication_before = self.comm.seconds
        batches = self.loader.batches(epoch)
        for step_in_epoch in range(self.loader.steps):
            start = time.perf_counter()
            self.on_phase(LOADING)
            batch = next(batches)
            self.on_phase(TRAIN)  # the user's transform and step are training: a deadlock in them is named
            if self.private and not self.loader.shuffle:  # unshuffled rows are views of the share: the user's
                batch = owned(batch)  # code changing them in place would change every later epoch's
            original = batch
            if self.transform is not None:
                batch = self.transform(batch, epoch, step_in_epoch)
            rows = batch_rows(batch)
            fetched = time.perf_counter()
            communication_at_step = self.comm.seconds
            value = (self.learn(batch, rows, step_in_epoch) if self.shapes_checked
                     else self.first_learn(original, batch, rows, step_in_epoch))
            if not math.isfinite(value):
                raise NumericalError(f"loss is {value} at epoch {epoch + 1}, step {step_in_epoch + 1}")
            finished = time.perf_counter()
            stats.data += fetched - start
            stats.compute += finished - fetched - (self.comm.seconds - communication_at_step)
            stats.rows += rows
            stats.loss_sum += value * rows
            stats.steps += 1
            self.step_in_epoch = step_in_epoch + 1
            if self.on_step is not None:
                self.on_step(value)
        self.algorithm.end_epoch(epoch)
        self.synchronize()
        stats.seconds = time.perf_counter() - began
        stats.communication = self.comm.seconds - communication_before
        return stats

    def learn(self, batch, rows: int, step_in_epoch: int) -> float:
        """One batch's forward and backward, and the update when its group is complete; the batch's loss."""
        if self.group_rows == 0:
            self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward(batch, rows)
        done = step_in_epoch + 1
        # the update follows this batch (groups of accumulated batches end with the epoch too)
        final = not self.accumulate or done % self.accumulate == 0 or done == self.loader.steps
        self.algorithm.before_backward(1.0 if self.accumulate else float(rows), self.group_rows + rows, final)
        (loss * rows if self.accumulate else loss).backward()  # summed over the group, then its mean
        self.group_rows += rows
        self.global_step += 1
        crossed = self.algorithm_steps(step_in_epoch)
        if final:
            self.update(len(crossed))
        for step in crossed:
            self.algorithm.after_step(step)
        return loss.item()  # also waits for the device, so the step's timing is honest

    def first_learn(self, original, batch, rows: int, step_in_epoch: int) -> float:
        """`learn` on the first batch the user's code makes (`original`: as the data gave it; `batch`: after the
        transform): a model refusing inputs that the transform or step reshaped, and taking the data's shape,
        is one line naming which (later batches have the same shapes: no cost per step)."""
        self.shapes_checked = True
        if not isinstance(original, tuple):  # fields: which of them the model takes is the step's to say
            return self.learn(batch, rows, step_in_epoch)
        inputs = ModelInputs(self.model)
        if not inputs.attach():  # a model that takes no hooks (TorchScript's): trained unchecked
            return self.learn(batch, rows, step_in_epoch)
        try:
            with inputs:
                return self.learn(batch, rows, step_in_epoch)
        except (RuntimeError, UserCodeError) as error:
            wrong = misshapen(self.model, original[0], batch[0], inputs.refused, error, self.autocast)
            if wrong is None:
                raise
            raise wrong from (error.__cause__ if isinstance(error, UserCodeError) else error)

    def forward(self, batch, rows: int) -> torch.Tensor:
        """The batch's loss: the model's outputs under the job's loss, or what the user's step makes of the
        batch (the numbers it logs are summed in)."""
        if self.step is not None:
            with self.autocast():
                loss, logged = self.step(self.model, batch)
            self.logged.add(logged, rows)
            return loss.float()
        inputs, labels = batch
        with self.autocast():
            outputs = self.model(inputs)
        return self.objective(outputs.float(), labels)

    def algorithm_steps(self, step_in_epoch: int) -> range:
        """The steps the algorithm is told of after this batch: the global step, or, where workers run their own
        step counts (speed shares) under an algorithm that `counts_nominal_steps` (a collective one), the nominal
        steps this batch completes, so every worker enters each round (and none twice) whatever its share."""
        plan = self.loader.plan
        if plan.equal or self.algorithm.same_steps() or not self.algorithm.counts_nominal_steps:
            return range(self.global_step, self.global_step + 1)
        first = self.epoch * plan.nominal
        crossed = nominal_crossed(step_in_epoch + 1, self.loader.steps, plan.nominal)
        return range(first + crossed.start, first + crossed.stop)

    def update(self, schedule_steps: int = 1) -> None:
        """The group's mean gradient, exchanged, clipped and applied; the schedule moves on `schedule_steps`
        steps (the nominal steps this batch completes, where workers run their own step counts, so every
        replica's per-step schedule keeps to the job's clock)."""
        if self.accumulate:
            for parameter in self.model.parameters():
                if parameter.grad is not None:
                    parameter.grad.div_(self.group_rows)
        self.algorithm.after_backward(self.group_rows)
        if self.clip_norm is not None:  # after the exchange: every worker clips the same gradients
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        self.optimizer.step()  # a no-op where the algorithm took the gradients over (Downpour)
        if self.schedule is not None:
            for _ in range(schedule_steps):
                self.schedule.after_step()
        self.group_rows = 0
