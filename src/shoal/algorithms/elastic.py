"""Elastic Averaging SGD (Zhang, Choromanska and LeCun, 2015), synchronous: workers on a spring.

Each worker trains its own replica x_i with its own optimizer. Every rank also holds the same
copy of a centre variable x~, which starts at the initial weights. Every `period` steps all
workers meet in an elastic round: each computes d_i = alpha * (x_i - x~) and moves to
x_i - d_i, and the centre moves by the sum of the d_i (one all-reduce of a flat buffer), so
the workers may explore away from the centre but are pulled back in proportion to the
distance. With `momentum` m the centre keeps a velocity, v <- m*v + sum_i d_i, x~ <- x~ + v
(mpi_learn's elastic momentum). `synchronous = false` builds the asynchronous variant with a
parameter server instead (`AsynchronousElasticAveraging` in `elastic_server.py`).

Which model is evaluated and saved: the centre, EASGD's consensus (`consensus()` lends it to
the model for the evaluation and the save, then gives the replica its own weights back), as
the asynchronous variant's server holds it. Checkpoints keep each replica and the centre, so a
resumed job continues exactly. Each epoch ends with an elastic round (when steps were taken
since the last one), and the batch-norm statistics (local, never part of the centre) are
averaged over all workers as in model averaging.

A resume on another number of workers reads rank 0's file only: the centre (and its velocity) is
every worker's anyway (the group centres are averaged at every epoch's end), each worker's replica
starts again at the centre, its optimizer moments are rank 0's, and the rounds' step counts
(`pulled_at`, `crossed_at`) go on from rank 0's.

With shares sized by speed (cluster.balance) a faster worker takes more steps between rounds:
periods count the nominal steps of an equal share; the elastic pull is each worker's alike.

With groups (cluster.groups = G, or "machine"), each group of contiguous workers has its own centre and
runs its elastic rounds every `group_period` steps; every `period` steps (and at every epoch's
end) the group centres and their velocities are replaced by their mean over all workers (each
group weighs as many workers as it has). Workers are not moved by that average: their next
group round pulls them towards the new centre, so they keep the freedom EASGD gives them.

With `compression` (see `compression.py`) the elastic round's all-reduce goes through the compressor. What
it sums is already a difference, d_i (alpha times a replica's distance to the centre), small next to the
weights: "bf16" rounds the centre's move to 8 bits, not the centre. Each worker still moves by its own
exact d_i; the centre moves by the compressed sum, the same bytes on every rank of the round, so there is
one centre. "powersgd" sends a low-rank approximation of each matrix's d_i and adds what it left out to the
worker's next round: the centre gets it a round late. The averages of the group centres stay exact. The
compressor's state (PowerSGD's queries and errors) is in the checkpoint; a resume on another number of
workers drops the errors (rank 0's are its own).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from shoal.algorithms.collective import CollectiveAlgorithm
from shoal.algorithms.compression import check_compression, make_compressor
from shoal.algorithms.groups import check_group_period, check_groups, check_period
from shoal.cluster.collectives import FlatBuffer
from shoal.errors import ConfigError


@dataclass
class ElasticOptions:
    elastic_force: float = 0.1
    """alpha: the fraction of its distance to the centre a worker moves back each round. The centre
    moves by alpha times the sum over N workers, so keep N * alpha <= 1 (the paper: 0.9 / N)."""
    period: str | int = 4
    """tau: steps between elastic rounds ("epoch": at every epoch's end only); with groups, the
    steps between averages of the group centres."""
    momentum: float = 0.0
    """Momentum of the centre's update (0: none)."""
    synchronous: bool = False
    """true: all workers meet every round (this module); false: the asynchronous parameter server
    (`elastic_server.py`)."""
    group_period: int | None = None
    """Steps between elastic rounds within each group (required with cluster.groups > 1)."""
    compression: str = "none"
    """What the elastic round's sum of the workers' moves travels as (synchronous = true only): "none" (exact),
    "bf16" or "fp16" (2 bytes a number, summed in fp32) or "powersgd" (low rank, with error feedback)."""
    compression_rank: int = 4
    """PowerSGD's rank: numbers sent per round are about rank x (rows + columns) of each weight matrix."""

    def __post_init__(self) -> None:
        if not _number(self.elastic_force) or not 0 < self.elastic_force < 1:
            raise ConfigError(f"algorithm.elastic_force: must be a number in (0, 1), got {self.elastic_force!r}")
        if not _number(self.momentum) or not 0 <= self.momentum < 1:
            raise ConfigError(f"algorithm.momentum: must be a number in [0, 1), got {self.momentum!r}")
        if not isinstance(self.synchronous, bool):
            raise ConfigError(f"algorithm.synchronous: must be true or false, got {self.synchronous!r}")
        check_period("algorithm.period", self.period)
        check_group_period(self.group_period, self.period)
        check_compression(self.compression, self.compression_rank)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class ElasticAveraging(CollectiveAlgorithm):
    """Elastic Averaging SGD, synchronous: every worker's replica tied to a shared centre by a spring."""

    name = "easgd"
    variant = {"synchronous": True}
    Options = ElasticOptions
    supports_groups = True

    @property
    def hierarchical(self) -> bool:
        return self.options.group_period is not None

    def check(self, world_size: int) -> None:
        super().check(world_size)
        check_groups(self.groups, self.options.group_period, world_size)
        # A round moves the gap between the workers' mean and the centre by a factor 1 - (N+1)*alpha.
        workers = max(len(g) for g in self.group_layout(world_size)) if self.hierarchical else world_size
        alpha = self.options.elastic_force
        if (workers + 1) * alpha >= 2:
            raise ConfigError(f"algorithm.elastic_force: {alpha} is too strong for rounds of {workers} workers: "
                              f"the centre overshoots further every round unless elastic_force < 2 / (workers + 1) "
                              f"= {2 / (workers + 1):.3g}; the paper uses 0.9 / workers = {0.9 / workers:.3g}")

    def same_steps(self) -> bool:
        return False  # a faster worker takes more steps between rounds

    def setup(self, model, optimizer, comm, on_update=None) -> None:
        super().setup(model, optimizer, comm, on_update)
        self.weights = FlatBuffer([p.data for p in model.parameters()])
        self.shapes = [p.shape for p in model.parameters()]
        self.compressor = None
        if self.options.compression != "none":
            self.compressor = make_compressor(self.options.compression, self.options.compression_rank, self.seed)
        self.centre = self.weights.pack().clone()  # every rank starts from rank 0's weights
        self.difference = torch.zeros_like(self.centre)
        self.velocity = torch.zeros_like(self.centre) if self.options.momentum else None
        self.centres = FlatBuffer([self.centre] if self.velocity is None else [self.centre, self.velocity])
        buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.buffers = FlatBuffer(buffers) if buffers else None
        if self.hierarchical:
            self.round_comm = comm.split(self.group_layout(comm.world_size))
            self.round_period = self.options.group_period
            self.cross_period = self.options.period if self.groups > 1 else None
        else:
            self.round_comm, self.round_period, self.cross_period = comm, self.options.period, None
        self.step_count = 0  # the global step just taken
        self.pulled_at = 0  # the global step of the last elastic round
        self.crossed_at = 0  # the global step of the last average of the group centres

    def elastic_round_(self) -> None:
        """Pull this replica towards the centre and the centre towards the replicas of the round."""
        weights = self.weights.pack()
        torch.sub(weights, self.centre, out=self.difference).mul_(self.options.elastic_force)
        weights.sub_(self.difference)
        self.weights.unpack_()
        if self.compressor is not None and self.round_comm.world_size > 1:
            self.compressor.sum_(self.difference, self.shapes, "elastic", self.round_comm)
        else:
            self.round_comm.all_reduce_sum_(self.difference)
        if self.velocity is not None:
            self.velocity.mul_(self.options.momentum).add_(self.difference)
            self.centre.add_(self.velocity)
        else:
            self.centre.add_(self.difference)

    def average_centres_(self) -> None:
        """Replace every group's centre (and its velocity) by their mean over all workers."""
        self.comm.all_reduce_mean_(self.centres.pack())
        self.centres.unpack_()

    def after_step(self, step: int) -> None:
        self.step_count = step
        if self.round_period != "epoch" and step % self.round_period == 0:
            self.elastic_round_()
            self.pulled_at = step
        if self.cross_period not in (None, "epoch") and step % self.cross_period == 0:
            self.average_centres_()
            self.crossed_at = step

    def end_epoch(self, epoch: int) -> None:
        if self.pulled_at != self.step_count:
            self.elastic_round_()
            self.pulled_at = self.step_count
        if self.cross_period is not None and self.crossed_at != self.step_count:
            self.average_centres_()
            self.crossed_at = self.step_count
        if self.buffers is not None and self.comm.world_size > 1:  # batch-norm statistics, for evaluation
            self.comm.all_reduce_mean_(self.buffers.pack())
            self.buffers.unpack_()

    @contextmanager
    def consensus(self):
        """The model holding the centre instead of this replica (its weights come back on leaving)."""
        local = self.weights.pack().clone()
        self.weights.buffer.copy_(self.centre)
        self.weights.unpack_()
        try:
            yield self.model
        finally:
            self.weights.buffer.copy_(local)
            self.weights.unpack_()

    def epoch_report(self) -> dict:
        """How far this replica is from the centre, relative to the centre's size."""
        weights = self.weights.pack()
        return {"distance_to_centre": float(torch.dist(weights, self.centre) / self.centre.norm().clamp_min(1e-12))}

    def state_dict(self) -> dict:
        state = {"centre": self.centre.clone(), "pulled_at": self.pulled_at, "crossed_at": self.crossed_at}
        if self.velocity is not None:
            state["velocity"] = self.velocity.clone()
        if self.compressor is not None and (compression := self.compressor.state_dict()):
            state["compression"] = compression
        return state

    def load_state_dict(self, state: dict) -> None:
        self.centre.copy_(state["centre"])
        if self.velocity is not None:
            self.velocity.copy_(state["velocity"])
        self.pulled_at = state["pulled_at"]
        self.crossed_at = state["crossed_at"]
        if self.compressor is not None:
            self.compressor.load_state_dict(state.get("compression", {}))

    def reshard_(self) -> None:
        """Every worker's replica starts again at the centre: rank 0's replica is one worker's exploration (and
        its compression errors its own)."""
        self.weights.buffer.copy_(self.centre)
        self.weights.unpack_()
        if self.compressor is not None:
            self.compressor.forget_errors()
