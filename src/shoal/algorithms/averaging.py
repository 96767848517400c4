"""Parallel SGD (model averaging): each worker trains alone, then the weights are averaged.

Each worker keeps its own optimizer and trains on its share; every `period` (an epoch, or a
number of steps) all replicas are replaced by their mean. With step periods the replicas are
also averaged at the end of every epoch, so evaluation, checkpoints and the saved model always
hold the consensus, never one worker's drifted copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.algorithms.base import Algorithm, model_state
from shoal.dist.collectives import FlatBuffer
from shoal.errors import ConfigError


@dataclass
class AveragingOptions:
    period: str | int = "epoch"
    """Average weights every epoch ("epoch") or every this many steps."""

    def __post_init__(self) -> None:
        steps = isinstance(self.period, int) and not isinstance(self.period, bool) and self.period >= 1
        if self.period != "epoch" and not steps:
            raise ConfigError(f"algorithm.period: must be \"epoch\" or a number of steps >= 1, got {self.period!r}")


class ModelAveraging(Algorithm):
    """Average parameters (and batch-norm statistics) across workers every period."""

    Options = AveragingOptions

    def setup(self, model, optimizer, comm) -> None:
        super().setup(model, optimizer, comm)
        self.state = FlatBuffer(model_state(model))
        self.step_count = 0  # the global step just taken
        self.averaged_at = 0  # the global step of the last average

    def average_(self) -> None:
        """Replace every replica by the mean of all replicas."""
        self.comm.all_reduce_mean_(self.state.pack())
        self.state.unpack_()

    def after_step(self, step: int) -> None:
        self.step_count = step
        if self.options.period != "epoch" and step % self.options.period == 0:
            self.average_()
            self.averaged_at = step

    def end_epoch(self, epoch: int) -> None:
        if self.options.period == "epoch" or self.averaged_at != self.step_count:
            self.average_()
            self.averaged_at = self.step_count

    def state_dict(self) -> dict:
        return {"averaged_at": self.averaged_at}

    def load_state_dict(self, state: dict) -> None:
        self.averaged_at = state["averaged_at"]
