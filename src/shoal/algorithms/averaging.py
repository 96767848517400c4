"""Parallel SGD (model averaging): each worker trains alone, then the weights are averaged.

Each worker keeps its own optimizer and trains on its share; every `period` (an epoch, or a
number of steps) all replicas are replaced by their mean. With step periods the replicas are
also averaged at the end of every epoch, so evaluation, checkpoints and the saved model always
hold the consensus, never one worker's drifted copy.

With groups (cluster.groups = G) the workers are split into G contiguous groups of nearly
equal size (or one group per machine: "machine"), and every `group_period` steps each group
averages within itself; rounds across all workers every `period` keep the groups together.
Inside a rack or a machine the group round is cheap, so the slow network between groups carries
one exchange per `period` only.

With shares sized by speed (cluster.balance) a faster worker takes more steps: periods count the
nominal steps of an equal share, and each mean weighs a replica by the rows it trained on since
the last round.

Every epoch ends with a round across all workers (or with a step that held one), so the replicas
are equal there: a resume on another number of workers gives every worker rank 0's replica, which
is the consensus, and rank 0's optimizer moments; `averaged_at` goes on from rank 0's.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.algorithms.base import model_state
from shoal.algorithms.collective import CollectiveAlgorithm
from shoal.algorithms.groups import check_group_period, check_groups, check_period
from shoal.cluster.collectives import FlatBuffer


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


class ModelAveraging(CollectiveAlgorithm):
    """Parallel SGD: each worker trains alone; parameters (and batch-norm statistics) averaged every period."""

    name = "averaging"
    Options = AveragingOptions
    supports_groups = True

    def check(self, world_size: int) -> None:
        super().check(world_size)
        check_groups(self.groups, self.options.group_period, world_size)

    def same_steps(self) -> bool:
        return False  # a faster worker takes more steps between rounds

    def setup(self, model, optimizer, comm) -> None:
        super().setup(model, optimizer, comm)
        self.state = FlatBuffer(model_state(model), extra=1)  # the last slot carries the rows, when weighed
        self.group_comm = None
        if self.options.group_period is not None:
            self.group_comm = comm.split(self.group_layout(comm.world_size))
        self.step_count = 0  # the global step just taken
        self.averaged_at = 0  # the global step of the last average across all workers
        self.rows = [0, 0]  # rows trained on since the last round across all workers, and within the group

    def after_backward(self, rows: int) -> None:
        self.rows[0] += rows
        self.rows[1] += rows

    def average_(self) -> None:
        """Replace every replica by the mean of all replicas."""
        self._average(self.comm, 0)
        self.rows[1] = 0

    def average_group_(self) -> None:
        """Replace every replica by the mean of its group's replicas."""
        self._average(self.group_comm, 1)

    def _average(self, comm, which: int) -> None:
        """The mean over `comm`'s replicas: plain, or weighed by the rows each trained on since the last round."""
        if comm.world_size == 1:
            self.rows[which] = 0
            return
        flat = self.state.pack()
        if self.weigh_by_rows:
            flat[:-1].mul_(self.rows[which])
            flat[-1] = self.rows[which]
            comm.all_reduce_sum_(flat)
            if flat[-1] > 0:  # no worker trained: the replicas are the same, keep them
                flat[:-1].div_(flat[-1])
                self.state.unpack_()
        else:
            comm.all_reduce_mean_(flat[:-1])
            self.state.unpack_()
        self.rows[which] = 0

    def after_step(self, step: int) -> None:
        self.step_count = step
        period, group_period = self.options.period, self.options.group_period
        if period != "epoch" and step % period == 0:
            self.average_()  # the mean of all workers is also the mean of the group means: no group round
            self.averaged_at = step
        elif group_period is not None and step % group_period == 0:
            self.average_group_()
            if self.groups == 1:  # the one group is every worker: a round of all
                self.averaged_at = step
                self.rows[0] = 0

    def end_epoch(self, epoch: int) -> None:
        if self.averaged_at != self.step_count:
            self.average_()
            self.averaged_at = self.step_count

    def holds_consensus(self) -> bool:
        """The replicas are the mean only right after a round across all workers (or before any step)."""
        return self.averaged_at == self.step_count

    def state_dict(self) -> dict:
        return {"averaged_at": self.averaged_at}

    def load_state_dict(self, state: dict) -> None:
        self.averaged_at = state["averaged_at"]
