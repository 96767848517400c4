"""The training loop: an ordinary PyTorch loop with the algorithm's hooks around it.

The loop knows nothing about distribution; it times each part of a step so that every epoch
reports where its time went: data (batch slicing and conversion), communication (whatever the
algorithm's collectives took) and compute (forward, backward and update).
"""

from __future__ import annotations

import math
import time
from dataclasses import astuple, dataclass

import torch

from shoal.algorithms.base import Algorithm
from shoal.cluster.collectives import Communicator
from shoal.data.loader import ShardLoader
from shoal.errors import ShoalError
from shoal.train.objective import Objective
from shoal.train.schedule import Schedule


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

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor(astuple(self), dtype=torch.float64)

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> EpochStats:
        return cls(*tensor.tolist())


class Trainer:
    """Runs epochs of one worker's share through the model; owns its counters (step, epoch)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, objective: Objective,
                 algorithm: Algorithm, loader: ShardLoader, comm: Communicator, *, on_step=None,
                 schedule: Schedule | None = None, clip_norm: float | None = None):
        self.model, self.optimizer, self.objective = model, optimizer, objective
        self.schedule, self.clip_norm = schedule, clip_norm
        self.algorithm, self.loader, self.comm = algorithm, loader, comm
        self.on_step = on_step  # called with the step's loss (the progress bar)
        self.global_step = 0  # steps taken, across epochs
        self.epoch = 0  # the epoch in progress (or last run), from 0
        self.synchronize = (lambda: torch.cuda.synchronize()) if loader.device.type == "cuda" else (lambda: None)

    def train_epoch(self, epoch: int) -> EpochStats:
        self.epoch = epoch
        stats = EpochStats()
        self.model.train()
        began = time.perf_counter()
        communication_before = self.comm.seconds
        batches = self.loader.batches(epoch)
        for step_in_epoch in range(self.loader.steps):
            start = time.perf_counter()
            inputs, labels = next(batches)
            fetched = time.perf_counter()
            communication_at_step = self.comm.seconds
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.objective(self.model(inputs), labels)
            loss.backward()
            rows = len(inputs)
            self.algorithm.after_backward(rows)
            if self.clip_norm is not None:  # after the exchange: every worker clips the same gradients
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
            self.optimizer.step()  # a no-op where the algorithm took the gradients over (Downpour)
            if self.schedule is not None:
                self.schedule.after_step()
            self.global_step += 1
            self.algorithm.after_step(self.global_step)
            value = loss.item()  # also waits for the device, so the timing below is honest
            if not math.isfinite(value):
                raise NumericalError(f"loss is {value} at epoch {epoch + 1}, step {step_in_epoch + 1}")
            finished = time.perf_counter()
            stats.data += fetched - start
            stats.compute += finished - fetched - (self.comm.seconds - communication_at_step)
            stats.rows += rows
            stats.loss_sum += value * rows
            stats.steps += 1
            if self.on_step is not None:
                self.on_step(value)
        self.algorithm.end_epoch(epoch)
        self.synchronize()
        stats.seconds = time.perf_counter() - began
        stats.communication = self.comm.seconds - communication_before
        return stats
