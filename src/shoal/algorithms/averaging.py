"""Parallel SGD (model averaging): each worker trains alone, then the weights are averaged.

Each worker keeps its own optimizer and trains on its share; every `period` (an epoch, or a
number of steps) all replicas are replaced by their mean. With step periods the replicas are
also averaged at the end of every epoch, so evaluation, checkpoints and the saved model always
hold the consensus, never one worker's drifted copy.

With groups (cluster.groups = G) the workers are split into G contiguous groups of nearly
equal size, and every `group_period` steps each group averages within itself; rounds across
all workers every `period` keep the groups together. Inside a rack or a machine the group
round is cheap, so the slow network between groups carries one exchange per `period` only.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.algorithms.base import Algorithm, model_state
from shoal.cluster.collectives import FlatBuffer
from shoal.errors import ConfigError


def check_period(key: str, period) -> None:
    """A period is "epoch" or a number of steps >= 1."""
    steps = isinstance(period, int) and not isinstance(period, bool) and period >= 1
    if period != "epoch" and not steps:
        raise ConfigError(f"{key}: must be \"epoch\" or a number of steps >= 1, got {period!r}")


def check_group_period(group_period, period) -> None:
    """`group_period`: unset, or a number of steps >= 1 below a step `period`."""
    if group_period is None:
        return
    if isinstance(group_period, bool) or not isinstance(group_period, int) or group_period < 1:
        raise ConfigError(f"algorithm.group_period: must be a number of steps >= 1, got {group_period!r}")
    if period != "epoch" and group_period >= period:
        raise ConfigError(f"algorithm.group_period: must be smaller than algorithm.period ({period}), or no "
                          f"round within a group comes between two rounds across groups; got {group_period}")


def check_groups(groups: int, group_period, trainers: int) -> None:
    """Refuse more groups than trainers, and groups without rounds of their own."""
    if groups > trainers:
        raise ConfigError(f"cluster.groups: {groups} groups need at least {groups} training workers, got {trainers}")
    if groups > 1 and group_period is None:
        raise ConfigError(f"algorithm.group_period: required with cluster.groups = {groups}: "
                          "the steps between rounds within a group")


def contiguous_groups(count: int, groups: int) -> list[list[int]]:
    """Ranks 0..count-1 in `groups` contiguous groups whose sizes differ by at most one (larger first)."""
    base, extra = divmod(count, groups)
    members, start = [], 0
    for group in range(groups):
        size = base + (1 if group < extra else 0)
        members.append(list(range(start, start + size)))
        start += size
    return members


@dataclass
class AveragingOptions:
    period: str | int = "epoch"
    """Average weights across all workers every epoch ("epoch") or every this many steps."""
    group_period: int | None = None
    """Average within each group every this many steps (required with cluster.groups > 1;
    with one group, the group is every worker)."""

    def __post_init__(self) -> None:
        check_period("algorithm.period", self.period)
        check_group_period(self.group_period, self.period)


class ModelAveraging(Algorithm):
    """Average parameters (and batch-norm statistics) across workers every period."""

    Options = AveragingOptions
    supports_groups = True

    def check(self, world_size: int) -> None:
        check_groups(self.groups, self.options.group_period, world_size)

    def setup(self, model, optimizer, comm) -> None:
        super().setup(model, optimizer, comm)
        self.check(comm.world_size)
        self.state = FlatBuffer(model_state(model))
        self.group_comm = None
        if self.options.group_period is not None:
            self.group_comm = comm.split(contiguous_groups(comm.world_size, self.groups))
        self.step_count = 0  # the global step just taken
        self.averaged_at = 0  # the global step of the last average across all workers

    def average_(self) -> None:
        """Replace every replica by the mean of all replicas."""
        self.comm.all_reduce_mean_(self.state.pack())
        self.state.unpack_()

    def average_group_(self) -> None:
        """Replace every replica by the mean of its group's replicas."""
        self.group_comm.all_reduce_mean_(self.state.pack())
        self.state.unpack_()

    def after_step(self, step: int) -> None:
        self.step_count = step
        period, group_period = self.options.period, self.options.group_period
        if period != "epoch" and step % period == 0:
            self.average_()  # the mean of all workers is also the mean of the group means: no group round
            self.averaged_at = step
        elif group_period is not None and step % group_period == 0:
            self.average_group_()
            if self.groups == 1:  # the one group is every worker
                self.averaged_at = step

    def end_epoch(self, epoch: int) -> None:
        if self.averaged_at != self.step_count:
            self.average_()
            self.averaged_at = self.step_count

    def state_dict(self) -> dict:
        return {"averaged_at": self.averaged_at}

    def load_state_dict(self, state: dict) -> None:
        self.averaged_at = state["averaged_at"]
