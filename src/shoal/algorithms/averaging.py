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

With `compression` (see `compression.py`) the rounds across all workers, the ones that cross the slow
network, send fewer bytes. Every rank keeps the anchor: the consensus after the last such round (at first
the broadcast initial weights). It sends its replica's difference from the anchor, scaled by its share of
the mean (its rows over the total, that total summed exactly beside it, when weighed; else 1 / N); the
compressor sums the shares, and every replica, and the anchor, becomes anchor + sum: the same bytes on every
rank. Differences, not weights, because a difference is what a worker learnt since the last round, small
next to the weights: "bf16" rounds that move to 8 bits, where rounding the weights would lose a part of them
as large as many steps' moves (about ten times the error, measured over a few rounds). "powersgd" sends a
low-rank approximation of each matrix's share and adds what it left out to the rank's next round, so it is
delayed, not lost. Rounds within a group (a machine or a rack) stay exact; with one group, its rounds are
every worker's and are compressed. "none" is the exact all-reduce of the weights above, unchanged.

With `reset_optimizer = true` the optimizer starts afresh after every round, as Kennedy et al.'s Parallel SGD
does when it compiles the model again each round: its per-parameter state (momentum buffers, Adam's moments and
step counts) is cleared, its param groups (learning rates, as a schedule set them) are kept. Every round means
group rounds too, not only rounds across all workers: each replaces a replica by a mean, and the moments a
replica gathered on its way there point along that replica's path, not the mean's. A round of one worker
alone leaves its weights as they are and resets the optimizer all the same: the option means one thing on any
number of workers.

With `outer` (see `outer.py`: DiLoCo, Douillard et al. 2023) a round across all workers averages each replica's
change since the last consensus rather than the weights, through the same exchange (the weights' mean, or the
compressor's summed differences from the anchor, which then are the changes themselves), and an outer optimizer
(torch's SGD, with Nesterov momentum or without) steps the consensus with the averaged change as its gradient. The
anchor is the consensus after the outer step; its momentum is every rank's, saved in each rank's checkpoint with
the anchor. Rounds within a group stay plain means; with one group, its rounds are every worker's and step. A
round of one worker alone steps too (its own change is the mean): the option means one thing on any number.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shoal.algorithms.base import model_state
from shoal.algorithms.collective import CollectiveAlgorithm
from shoal.algorithms.compression import check_compression, make_compressor
from shoal.algorithms.groups import check_group_period, check_groups, check_period
from shoal.algorithms.outer import OuterOptimizer, check_outer
from shoal.cluster.collectives import FlatBuffer
from shoal.errors import ConfigError


@dataclass
class AveragingOptions:
    period: str | int = "epoch"
    """Average weights across all workers every epoch ("epoch") or every this many steps."""
    group_period: int | None = None
    """Average within each group every this many steps (required with cluster.groups > 1;
    with one group, the group is every worker)."""
    compression: str = "none"
    """What a round across all workers sends: "none" (the weights, exact), "bf16" or "fp16" (each replica's
    difference from the last consensus, 2 bytes a number, summed in fp32) or "powersgd" (that difference in low
    rank, with error feedback). Rounds within a group stay exact."""
    compression_rank: int = 4
    """PowerSGD's rank: numbers sent per round are about rank x (rows + columns) of each weight matrix."""
    reset_optimizer: bool = False
    """Clear the optimizer's state (momentum, Adam's moments and step count; not its learning rates) after every
    round, within a group or across all workers (Kennedy et al.'s Parallel SGD starts each round afresh)."""
    outer: dict | None = field(default=None, metadata={"refused_elsewhere": "an outer optimizer steps on the rounds "
                                                                            "of 'averaging'"})
    """DiLoCo's outer optimizer on every round across all workers, e.g. { name = "nesterov", lr = 0.7, momentum = 0.9 }
    ("sgd": without Nesterov; lr 1 and momentum 0 is the plain mean). Unset: the plain mean."""

    def __post_init__(self) -> None:
        check_period("algorithm.period", self.period)
        check_compression(self.compression, self.compression_rank)
        check_group_period(self.group_period, self.period)
        if not isinstance(self.reset_optimizer, bool):
            raise ConfigError(f"algorithm.reset_optimizer: must be true or false, got {self.reset_optimizer!r}")
        check_outer(self.outer)


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

    def setup(self, model, optimizer, comm, on_update=None) -> None:
        super().setup(model, optimizer, comm, on_update)
        self.state = FlatBuffer(model_state(model), extra=1)  # the last slot carries the rows, when weighed
        self.group_comm = None
        if self.options.group_period is not None:
            self.group_comm = comm.split(self.group_layout(comm.world_size))
        self.step_count = 0  # the global step just taken
        self.averaged_at = 0  # the global step of the last average across all workers
        self.rows = [0, 0]  # rows trained on since the last round across all workers, and within the group
        self.compressor, self.anchor, self.outer = None, None, None
        if self.options.compression != "none":
            self.compressor = make_compressor(self.options.compression, self.options.compression_rank, self.seed)
            self.shapes = [tensor.shape for tensor in self.state.tensors]
        if self.options.outer is not None:  # model_state puts the parameters first: the numbers that step
            self.outer = OuterOptimizer(self.options.outer, sum(p.numel() for p in model.parameters()),
                                        self.state.buffer)
        if self.compressor is not None or self.outer is not None:
            self.anchor = self.state.pack()[:-1].clone()  # the consensus: rank 0's, broadcast by super().setup

    def after_backward(self, rows: int) -> None:
        self.rows[0] += rows
        self.rows[1] += rows

    def average_(self) -> None:
        """Replace every replica by the mean of all replicas (with `outer`: the consensus its step makes of it)."""
        if self.outer is not None:
            self._outer_round()
        elif self.compressor is not None:
            self._average_compressed()
        else:
            self._average(self.comm, 0)
        self.rows[1] = 0
        self._restart_optimizer()

    def average_group_(self) -> None:
        """Replace every replica by the mean of its group's replicas."""
        if self.groups == 1 and (self.compressor is not None or self.outer is not None):
            self.average_()  # the one group is every worker: its rounds cross the network, compressed or stepped
        else:
            self._average(self.group_comm, 1)
            self._restart_optimizer()

    def _restart_optimizer(self) -> None:
        """With reset_optimizer: the optimizer as a fresh one of the same settings, after a round. torch's
        optimizers make a parameter's state at its first step, so an empty state is a fresh optimizer's."""
        if self.options.reset_optimizer:
            self.optimizer.state.clear()

    def _average(self, comm, which: int) -> bool:
        """The mean over `comm`'s replicas: plain, or weighed by the rows each trained on since the last round.
        False where no worker trained since (weighed: the replicas are left as they are)."""
        if comm.world_size == 1:
            self.rows[which] = 0
            return True
        flat = self.state.pack()
        if self.weigh_by_rows:
            flat[:-1].mul_(self.rows[which])
            flat[-1] = self.rows[which]
            comm.all_reduce_sum_(flat)
            trained = bool(flat[-1] > 0)
            if trained:  # no worker trained: the replicas are the same, keep them
                flat[:-1].div_(flat[-1])
                self.state.unpack_()
        else:
            comm.all_reduce_mean_(flat[:-1])
            self.state.unpack_()
            trained = True
        self.rows[which] = 0
        return trained

    def _average_compressed(self) -> None:
        """A round across all workers through the compressor: each replica's share of the mean's move away from
        the anchor is summed, and every replica (and the anchor) becomes anchor + that sum."""
        if self.comm.world_size == 1:
            self.rows[0] = 0
            return
        move = self._summed_move()
        if move is None:  # no worker trained: every replica is the anchor, keep them
            return
        self.anchor.add_(move)
        move.copy_(self.anchor)
        self.state.unpack_()

    def _summed_move(self) -> torch.Tensor | None:
        """The mean's move away from the anchor, the same bytes on every rank: each replica's share of it summed
        through the compressor (in the flat buffer, which is returned); None where no worker trained."""
        comm = self.comm
        flat = self.state.pack()
        difference = flat[:-1]
        if comm.world_size == 1:
            share = 1.0
        elif self.weigh_by_rows:
            total = torch.tensor([float(self.rows[0])], dtype=flat.dtype, device=flat.device)
            comm.all_reduce_sum_(total)  # exact: the weights of the mean must not be rounded
            share = self.rows[0] / total.item() if total.item() > 0 else None
        else:
            share = 1.0 / comm.world_size
        self.rows[0] = 0
        if share is None:
            return None
        difference.sub_(self.anchor).mul_(share)
        if comm.world_size > 1:
            self.compressor.sum_(difference, self.shapes, "average", comm)
        return difference

    def _outer_round(self) -> None:
        """DiLoCo's round (see `outer.py`): the averaged change since the consensus, through the round's exchange
        (compressed or not), and the outer optimizer's step with it; every replica, and the anchor, becomes the
        new consensus."""
        if self.compressor is not None:
            mean = self._summed_move()
            if mean is None:
                return
            change = mean.neg()  # the consensus minus each replica, averaged
            mean.add_(self.anchor)
        else:
            if not self._average(self.comm, 0):
                return
            mean = self.state.pack()[:-1]
            change = self.anchor - mean
        size = self.outer.size
        self.outer.step_(mean[:size], change[:size])
        self.anchor.copy_(mean)
        self.state.unpack_()

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
        state = {"averaged_at": self.averaged_at}
        if self.anchor is not None:
            state["anchor"] = self.anchor.clone()
        if self.compressor is not None:
            compression = self.compressor.state_dict()
            if compression:
                state["compression"] = compression
        if self.outer is not None:
            outer = self.outer.state_dict()
            if outer:
                state["outer"] = outer
        return state

    def load_state_dict(self, state: dict) -> None:
        self.averaged_at = state["averaged_at"]
        if self.anchor is not None:
            # Without an anchor (a job that turns compression on as it resumes) the epoch's closing round left
            # the consensus in the model, loaded before this.
            self.anchor.copy_(state["anchor"] if "anchor" in state else self.state.pack()[:-1])
        if self.compressor is not None:
            self.compressor.load_state_dict(state.get("compression", {}))
        if self.outer is not None:
            self.outer.load_state_dict(state.get("outer", {}))

    def reshard_(self) -> None:
        if self.compressor is not None:
            self.compressor.forget_errors()  # rank 0's remainder is its own; the anchor is every worker's
