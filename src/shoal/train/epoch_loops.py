"""The epoch loop of each role: a trainer trains its share, a server or relay serves the trainers.

Both keep the job's global step count, which the checkpoint stores, and return the epoch's
`EpochStats` so that every rank takes part in the same gather at the epoch's end.
"""

from __future__ import annotations

import time

from shoal.algorithms import ServerAlgorithm
from shoal.train.loop import EpochStats, Trainer


class Training:
    """A training rank: the loop over its share."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer

    @property
    def global_step(self) -> int:
        return self.trainer.global_step

    @global_step.setter
    def global_step(self, value: int) -> None:
        self.trainer.global_step = value

    def run_epoch(self, epoch: int) -> EpochStats:
        return self.trainer.train_epoch(epoch)


class Serving:
    """A parameter server or relay: serves every trainer's exchanges of the epoch."""

    def __init__(self, algorithm: ServerAlgorithm, steps_per_epoch: int):
        self.algorithm, self.steps_per_epoch = algorithm, steps_per_epoch
        self.global_step = 0  # the trainers' steps, counted as theirs

    def run_epoch(self, epoch: int) -> EpochStats:
        began = time.perf_counter()
        self.algorithm.serve_epoch(epoch)
        self.global_step += self.steps_per_epoch
        return EpochStats(seconds=time.perf_counter() - began)
