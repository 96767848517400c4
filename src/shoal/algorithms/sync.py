"""Synchronous SGD: gradients averaged over all workers after every backward pass.

Each worker's gradient is a mean over its own batch; weighting it by the batch's rows before
the sum makes the result the exact mean over the global batch even when the last batches of
an epoch differ by a row. N workers with batch b therefore take the steps of one worker
with batch N*b. Every replica and its optimizer state are the same, so a resume on another number
of workers gives every worker rank 0's.

The gradients travel in buckets exchanged while the backward pass runs (`overlap`, see
`exchange.py`), through the machines' first workers when a machine runs several (`hierarchical`),
and compressed if the job asks (`compression`, see `compression.py`): "none" keeps the claim above
exact; "bf16"/"fp16" round the summed gradients once; "powersgd" sends a low-rank approximation
and feeds back what it left out. Whatever the compression, every rank gets the same bytes from the
collectives; where machines' CPUs round PowerSGD's matrix products differently, the digest compared at
each epoch's end (`agree`) makes the replicas' weights rank 0's again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from shoal.algorithms.collective import CollectiveAlgorithm
from shoal.algorithms.compression import check_compression, make_compressor
from shoal.algorithms.exchange import GradientExchange, Route
from shoal.bucket_rules import capacity
from shoal.cluster.collectives import FlatBuffer
from shoal.cluster.env import cores
from shoal.errors import ConfigError


@dataclass
class SyncOptions:
    compression: str = "none"
    """What the gradients become on the wire: "none" (exact), "bf16" or "fp16" (2 bytes a number, summed in
    fp32) or "powersgd" (low rank with error feedback)."""
    compression_rank: int = 4
    """PowerSGD's rank: numbers sent per step are about rank x (rows + columns) of each weight matrix."""
    overlap: bool | str = "auto"
    """Exchange buckets of gradients while the backward pass computes the rest: true, false, or "auto": where the
    exchange has a processor of its own to run on (a GPU computes, or the worker has a core beyond its compute
    threads). On a one-core host the exchange's copies and the network stack's work share the core with the
    backward pass: at 1 Gbit/s a 2.66M-parameter MLP's epoch took 11.4 s overlapped against 8.7 s (back to back)
    and 8.77 against 8.45 s in benchmarks/results/2026-11-28-2core-cpu-comm.md, where at 100 Mbit/s overlap
    was the faster (60.4 against 72.6 s, inside that link's run-to-run spread of about 15%)."""
    bucket_mb: float | None = None
    """Megabytes of gradients per bucket (default: an eighth of the model's, between 0.25 and 8)."""
    hierarchical: bool = True
    """With several workers on a machine: sum within the machine first, so the link carries one exchange
    per machine."""

    def __post_init__(self) -> None:
        check_compression(self.compression, self.compression_rank)
        if not isinstance(self.overlap, bool) and self.overlap != "auto":
            raise ConfigError(f'algorithm.overlap: must be true, false or "auto", got {self.overlap!r}')
        if not isinstance(self.hierarchical, bool):
            raise ConfigError(f"algorithm.hierarchical: must be true or false, got {self.hierarchical!r}")
        size = self.bucket_mb
        if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0):
            raise ConfigError(f"algorithm.bucket_mb: must be a number of megabytes > 0, got {size!r}")


class SynchronousSGD(CollectiveAlgorithm):
    """Synchronous SGD: gradients averaged over all workers after every backward pass."""

    name = "sync"
    Options = SyncOptions

    def __init__(self, options=None, groups=1):
        super().__init__(options, groups)
        # its state exists before setup (a checkpoint may be read first); setup makes it again from the job's seed
        self.compressor = make_compressor(self.options.compression, self.options.compression_rank)
        self.exchange: GradientExchange | None = None
        self.resynchronized = 0  # epochs whose end found replicas apart (never, where every CPU rounds alike)
        self.clocks = (0.0, 0.0)  # the exchange's seconds and the loop's wait for it, at the last epoch's end
        self.report: dict = {}

    def setup(self, model, optimizer, comm, on_update=None) -> None:
        super().setup(model, optimizer, comm, on_update)
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.compressor = make_compressor(self.options.compression, self.options.compression_rank, self.seed)
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.buffer_flat = FlatBuffer(self.buffers) if self.buffers else None
        if comm.world_size > 1 and self.parameters:
            total = sum(p.numel() for p in self.parameters) * 4
            overlap = self.overlapping(comm)
            self.exchange = GradientExchange(self.parameters, comm, self.route(comm), self.compressor,
                                             capacity=capacity(total, self.options.bucket_mb, overlap),
                                             overlap=overlap)

    def overlapping(self, comm) -> bool:
        """`overlap` as given, or for "auto": whether every worker's exchange has a processor its backward pass does
        not use (a GPU computes, or its machine has cores beyond its workers' compute threads). Decided together:
        the two ways make different collectives, so every rank must take the same."""
        if isinstance(self.options.overlap, bool):
            return self.options.overlap
        machine = next((members for members in self.machines or [] if comm.rank in members), [comm.rank])
        spare = self.parameters[0].device.type != "cpu" or cores() > torch.get_num_threads() * len(machine)
        return all(comm.all_gather_object(spare))

    def route(self, comm) -> Route:
        """Within each machine then across machines, where a machine runs several workers and there are several."""
        machines = self.machines or [[rank] for rank in range(comm.world_size)]
        base = comm.detached()  # the exchange's own clock: its time is the loop's only while the loop waits
        if not self.options.hierarchical or len(machines) == 1 or all(len(m) == 1 for m in machines):
            return Route(base)
        inside = base.split(machines)
        across = base.split([[members[0] for members in machines]])
        return Route(base, inside, across)

    def before_backward(self, weight: float, rows: int, final: bool) -> None:
        if self.exchange is not None:
            self.exchange.begin(weight, rows, final)

    def after_backward(self, rows: int) -> None:
        if self.exchange is not None:
            self.exchange.finish()

    def end_epoch(self, epoch: int) -> None:
        if self.comm.world_size == 1:
            return
        # Parameters never diverge, but batch-norm statistics are local: share them for evaluation.
        if self.buffer_flat is not None:
            self.comm.all_reduce_mean_(self.buffer_flat.pack())
            self.buffer_flat.unpack_()
        self.agree()
        self.report = self.epoch_exchange()

    def epoch_exchange(self) -> dict:
        """The epoch's exchange: its seconds on its own thread, and how much of them the backward pass hid."""
        if self.exchange is None:
            return {}
        clocks = (self.exchange.route.seconds(), self.exchange.waited)
        exchange, waited = clocks[0] - self.clocks[0], clocks[1] - self.clocks[1]
        self.clocks = clocks
        report = {"compression": self.options.compression, "exchange_seconds": round(exchange, 4),
                  "hidden_seconds": round(max(0.0, exchange - waited), 4), "buckets": len(self.exchange.buckets)}
        if self.resynchronized:
            report["resynchronized"] = self.resynchronized
        return report

    def agree(self) -> None:
        """Every replica holds the same bytes: checked by a digest each epoch, and rank 0's weights broadcast
        where they differ (machines whose CPUs round a matrix product or a fused update differently)."""
        flat = FlatBuffer(self.parameters)  # made here: a model's copy held only for the check
        weights = flat.pack()
        digest = hashlib.blake2b(weights.detach().cpu().numpy().tobytes(), digest_size=8).digest()
        digests = self.comm.all_gather_object(digest)
        if len(set(digests)) > 1:
            self.comm.broadcast_(weights, source=0)
            flat.unpack_()
            self.resynchronized += 1

    def epoch_report(self) -> dict:
        return self.report

    def state_dict(self) -> dict:
        state = self.compressor.state_dict()
        return {"compression": state} if state else {}

    def load_state_dict(self, state: dict) -> None:
        if "compression" in state:
            self.compressor.load_state_dict(state["compression"])

    def close(self) -> None:
        if self.exchange is not None:
            self.exchange.close()

    def reshard_(self) -> None:
        self.compressor.forget_errors()  # rank 0's remainder is its own, not every worker's
