"""What `sync`'s exchange of gradients costs a step, as the job's [algorithm] options set it.

The algorithm (shoal.algorithms.exchange) cuts the parameters, in the backward pass's order, into
buckets of `bucket_mb` (by default an eighth of the gradients' bytes, between 0.25 and 8 MB), sums
the step's row count exactly (in a collective of its own where it overlaps or sends half precision,
else as the first bucket's last number), and sends each bucket as the compression
says: `none`, a ring all-reduce of its fp32 values; `bf16`/`fp16`, half those bytes in as many
rounds (a reduce-scatter as one all-to-all, then an all-gather); `powersgd`, each matrix large
enough to gain as its rank-r factors P (n x r) and Q (m x r) in two all-reduces, the rest exact in
the first. With `overlap` the buckets travel while the backward pass computes the rest, so only
what outlasts it counts as communication. With several workers per machine and `hierarchical`, a
bucket is summed over loopback first and only the machines' first workers use the link. Pure
arithmetic (no torch), so every figure can be checked by hand; the bucket cut and PowerSGD's rule
are the algorithm's own (shoal.bucket_rules).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shoal.bucket_rules import capacity as bucket_capacity
from shoal.bucket_rules import cut, factored
from shoal.errors import ConfigError
from shoal.plan.costs import Link, hierarchical_all_reduce, ring_all_reduce

VALUE_BYTES = 4  # float32
ROWS_BYTES = 8  # the step's row count (float64), summed exact before the buckets
COMPRESSIONS = ("none", "bf16", "fp16", "powersgd")
HALF = ("bf16", "fp16")
DEFAULT_RANK = 4
# The profile times whole steps, not their forward and backward passes apart: the backward is taken as 2/3 of
# a step, as a dense layer's backward does twice the multiply-adds of its forward.
BACKWARD_SHARE = 2 / 3
# A dense layer's step does about 3 multiply-adds per parameter and row (forward 1, backward 2): the measured
# step so gives a multiply-add's seconds. Layers that reuse a weight over positions (convolutions) do more, which
# overprices PowerSGD's compute, but by a small share of a step either way (about 16 / (3 x batch) of it at r = 4).
STEP_MULTIPLY_ADDS = 3
HALF_CASTS = 2  # bf16/fp16: each bucket cast down before it is sent and back after, a copy's cost each


@dataclass(frozen=True)
class SyncOptions:
    """`sync`'s exchange options, with the defaults the algorithm takes."""

    compression: str = "none"
    rank: int = DEFAULT_RANK
    overlap: bool = False
    """Priced overlapped only when the job says `overlap = true`: "auto" overlaps where the exchange has a processor
    of its own (a GPU computes, or a core beyond the worker's threads), and the plan prices CPU workers whose
    threads take their cores."""
    hierarchical: bool = True
    bucket_mb: float | None = None

    @classmethod
    def of(cls, options: dict) -> SyncOptions:
        bucket, compression = options.get("bucket_mb"), str(options.get("compression", "none"))
        if compression not in COMPRESSIONS:
            raise ConfigError(f"algorithm.compression: expected one of {', '.join(COMPRESSIONS)}, got {compression!r}")
        return cls(compression=compression, rank=int(options.get("compression_rank", DEFAULT_RANK)),
                   overlap=options.get("overlap", "auto") is True, hierarchical=bool(options.get("hierarchical", True)),
                   bucket_mb=None if bucket is None else float(bucket))


Shapes = tuple[tuple[int, ...], ...]


def capacity(parameters: int, options: SyncOptions) -> int:
    """Bytes after which the algorithm closes a bucket (shoal.bucket_rules): `bucket_mb`; by default an eighth of
    the gradients' bytes between the bounds, or all of them without overlap (one exchange after the backward
    pass)."""
    return bucket_capacity(parameters * VALUE_BYTES, options.bucket_mb, options.overlap)


def buckets(parameters: int, shapes: Shapes, options: SyncOptions) -> list[Shapes]:
    """The parameters' shapes cut as the algorithm cuts them: in reverse order (the backward pass's), a bucket
    closed once it holds `capacity` bytes; the first one out of the backward pass first. Without shapes, the
    gradients as one vector cut evenly."""
    limit = capacity(parameters, options)
    if not shapes:
        count = max(1, math.ceil(parameters * VALUE_BYTES / limit))
        return [((parameters // count + (index < parameters % count),),) for index in range(count)]
    cuts = cut([math.prod(shape) * VALUE_BYTES for shape in shapes], limit)
    return [tuple(shapes[position] for position in positions) for positions in cuts]


def payloads(bucket: Shapes, options: SyncOptions) -> list[float]:
    """Bytes of each all-reduce one bucket makes (each priced as a ring all-reduce of that many bytes)."""
    values = sum(math.prod(shape) for shape in bucket)
    if options.compression in HALF:
        return [values * 2.0]
    if options.compression != "powersgd":
        return [values * float(VALUE_BYTES)]
    first, second = values, 0
    for shape in bucket:
        found = factored(shape, options.rank)
        if found is not None:
            rows, columns = found
            first, second = first - rows * columns + options.rank * rows, second + options.rank * columns
    return [float(count * VALUE_BYTES) for count in (first, second) if count]


def extra_multiply_adds(bucket: Shapes, rank: int) -> float:
    """PowerSGD's compute for a bucket: for each factored matrix about 4 n m r multiply-adds (M Q, M^T P, P Q^T and
    the error feedback) and a QR of P (Householder: about n r^2)."""
    total = 0.0
    for shape in bucket:
        found = factored(shape, rank)
        if found is not None:
            rows, columns = found
            total += 4 * rows * columns * rank + rows * rank**2
    return total


@dataclass(frozen=True)
class Topology:
    """Where the ranks are: `nodes` machines of `per_node` workers, their links across and inside."""

    nodes: int
    per_node: int
    across: Link
    inside: Link

    @property
    def hierarchical(self) -> bool:
        """Whether a hierarchical exchange has a machine to sum within and machines to cross."""
        return self.nodes > 1 and self.per_node > 1


def collective_seconds(exact: float, sizes: list[float], topology: Topology, hierarchical: bool) -> tuple[float, float]:
    """(seconds, bytes a rank sends over the link) of one sum of `exact` fp32 bytes sent as all-reduces of `sizes`.
    Hierarchical: summed onto the machine's first worker and shared back over loopback (priced as a ring all-reduce
    of the fp32 bytes there), the machines' first workers' collectives across."""
    nodes, per_node = topology.nodes, topology.per_node
    if hierarchical and topology.hierarchical:
        inside = ring_all_reduce(exact, per_node).seconds(topology.inside)
        across = sum(ring_all_reduce(size, nodes).seconds(topology.across) for size in sizes)
        return inside + across, sum(ring_all_reduce(size, nodes).bytes_sent for size in sizes)
    seconds = sum(hierarchical_all_reduce(size, nodes, per_node, topology.inside, topology.across) for size in sizes)
    return seconds, sum(ring_all_reduce(size, nodes * per_node).bytes_sent for size in sizes)


@dataclass(frozen=True)
class StepExchange:
    """One step's exchange: `early` seconds of the row count's sum (started before the backward pass), `seconds` of
    the buckets', `last` of them the last bucket's (the first layers', ready only when the backward pass ends),
    `bytes_sent` by a rank over the link, and the extra `compute` seconds of compressing."""

    early: float
    seconds: float
    last: float
    bytes_sent: float
    compute: float = 0.0
    buckets: int = 1

    def exposed(self, backward: float, overlap: bool) -> float:
        """Seconds a step waits for it after `backward` seconds of backward pass. With overlap everything but the
        last bucket can travel meanwhile and only what outlasts the pass shows; the last bucket never hides.
        Without, the row count and the buckets go after it."""
        if not overlap:
            return self.early + self.seconds
        return max(0.0, self.early + self.seconds - self.last - backward) + self.last


def step_exchange(parameters: int, shapes: Shapes, options: SyncOptions, topology: Topology,
                  multiply_add: float = 0.0, copy_per_value: float = 0.0) -> StepExchange:
    """The exchange one step makes under `options`; `multiply_add` and `copy_per_value`: seconds of one of each on
    this machine (the compression's compute)."""
    cut = buckets(parameters, shapes, options)
    early, sent = collective_seconds(ROWS_BYTES, [ROWS_BYTES], topology, options.hierarchical)
    if not options.overlap and options.compression not in HALF:  # the count rides in the first bucket
        early, sent = 0.0, 0.0
    seconds, last, compute = 0.0, 0.0, 0.0
    for bucket in cut:
        values = sum(math.prod(shape) for shape in bucket)
        last, bytes_sent = collective_seconds(values * VALUE_BYTES, payloads(bucket, options), topology,
                                              options.hierarchical)
        seconds, sent = seconds + last, sent + bytes_sent
        if options.compression == "powersgd":
            compute += extra_multiply_adds(bucket, options.rank) * multiply_add
        elif options.compression in HALF:
            compute += HALF_CASTS * values * copy_per_value
    return StepExchange(early=early, seconds=seconds, last=last, bytes_sent=sent, compute=compute,
                        buckets=len(cut))
