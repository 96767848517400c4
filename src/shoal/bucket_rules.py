"""How `sync` cuts its gradients into buckets and which of them PowerSGD factors: plain arithmetic.

The algorithm (shoal.algorithms.exchange, shoal.algorithms.compression) follows these rules on its
parameters, and the planner (shoal.plan.exchange) on their shapes alone, without torch: one copy of
each rule, so a plan prices the cut the job will make.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MEGABYTE = 1 << 20  # as `algorithm.bucket_mb` counts
SMALLEST_BUCKET, LARGEST_BUCKET = MEGABYTE // 4, 8 * MEGABYTE  # the default bucket's bounds, in bytes
BUCKET_SHARE = 1 / 8  # of the gradients' bytes: the default bucket


def bucket_bytes(total: int, chosen: float | None) -> int:
    """Bytes a bucket holds: `chosen` megabytes, or an eighth of the gradients' bytes between 0.25 and 8 MB
    (several buckets to overlap, each large enough that its messages' fixed cost is small on a LAN)."""
    if chosen is not None:
        return max(1, int(chosen * MEGABYTE))
    return int(min(LARGEST_BUCKET, max(SMALLEST_BUCKET, total * BUCKET_SHARE)))


def capacity(total: int, chosen: float | None, overlap: bool) -> int:
    """Bytes after which a bucket closes: `bucket_bytes`, or, without overlap and without a chosen size, all
    `total` of them (one exchange after the backward pass)."""
    return bucket_bytes(total, chosen) if overlap or chosen is not None else max(total, 1)


def cut(sizes: Sequence[int], limit: int) -> list[list[int]]:
    """The positions of parameters of `sizes` bytes, in reverse order (the backward pass's), cut into buckets each
    closed once it holds `limit` bytes; the first out of the backward pass first."""
    found, current, size = [], [], 0
    for position in reversed(range(len(sizes))):
        current.append(position)
        size += sizes[position]
        if size >= limit:
            found.append(current)
            current, size = [], 0
    return found + [current] if current else found


def factored(shape: Sequence[int], rank: int) -> tuple[int, int] | None:
    """(n, m) of a parameter PowerSGD sends as P and Q: a matrix (first dimension by the rest) with
    min(n, m) > rank and the factors smaller than it. None: it goes exact."""
    if len(shape) < 2:
        return None
    rows, columns = shape[0], math.prod(shape[1:])
    if min(rows, columns) > rank and rank * (rows + columns) < rows * columns:
        return rows, columns
    return None
