"""The partition plan: which rows each rank trains on, and in which batches.

Pure functions of (rows, world size, batch size, seed, epoch): every rank computes the same
plan without talking to the others. Shares are contiguous row ranges that differ by at most
one row, so each rank reads only the files and row groups holding its range. Every rank runs
the same number of steps per epoch (collectives never mismatch); the last batch of an epoch
takes whatever rows remain, so every row is used exactly once per epoch. These are the equal
shares (cluster.balance = "equal"); `balance` cuts shares sized by each worker's speed.
"""

from __future__ import annotations

import math

import numpy as np

from shoal.errors import DataError


def share(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """Row range [start, stop) of `rank`; the first rows % world_size ranks hold one more row."""
    base, extra = divmod(rows, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def steps_per_epoch(rows: int, world_size: int, batch_size: int) -> int:
    """Steps every rank runs per epoch: enough batches to cover the smallest share."""
    smallest = rows // world_size
    if smallest == 0:
        raise DataError(f"the dataset has {rows} rows, fewer than the {world_size} workers")
    return math.ceil(smallest / batch_size)


def epoch_order(share_rows: int, *, seed: int, epoch: int, rank: int, shuffle: bool = True) -> np.ndarray:
    """The order in which a rank visits its rows this epoch (indices into its share)."""
    if not shuffle:
        return np.arange(share_rows)
    generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, rank])))
    return generator.permutation(share_rows)


def batch_bounds(share_rows: int, steps: int, batch_size: int) -> list[tuple[int, int]]:
    """[lo, hi) positions in the epoch order for each step; the last batch takes the remainder."""
    bounds = [(step * batch_size, (step + 1) * batch_size) for step in range(steps)]
    bounds[-1] = (bounds[-1][0], share_rows)
    return bounds


def sub_partitions(share_rows: int, part_rows: int) -> list[tuple[int, int]]:
    """The fewest contiguous [lo, hi) pieces of at most `part_rows` rows, sizes differing by <= 1.

    Balanced pieces each hold at least `part_rows // 2` rows (when there are several), so a
    batch of at most that many rows never spans more than two of them.
    """
    count = max(1, -(-share_rows // part_rows))
    return [share(share_rows, count, piece) for piece in range(count)]


def blocked_epoch_order(
    share_rows: int, part_rows: int, *, seed: int, epoch: int, rank: int, shuffle: bool = True
) -> np.ndarray:
    """An epoch order that visits one sub-partition at a time: parts in a seeded order, rows shuffled within.

    A batch then spans at most two sub-partitions, so a loader needs only the sub-partitions
    of the current batch in memory.
    """
    return blocked_epoch_plan(share_rows, part_rows, seed=seed, epoch=epoch, rank=rank, shuffle=shuffle)[0]


def blocked_epoch_plan(
    share_rows: int, part_rows: int, *, seed: int, epoch: int, rank: int, shuffle: bool = True
) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """`blocked_epoch_order` and its visits: (sub-partition, first position, end position) in order."""
    parts = sub_partitions(share_rows, part_rows)
    if not shuffle:
        return np.arange(share_rows), [(part, lo, hi) for part, (lo, hi) in enumerate(parts)]
    generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, rank, part_rows])))
    pieces, visits, position = [], [], 0
    for part in generator.permutation(len(parts)):
        lo, hi = parts[part]
        pieces.append(lo + generator.permutation(hi - lo))
        visits.append((int(part), position, position + hi - lo))
        position += hi - lo
    return (np.concatenate(pieces) if pieces else np.arange(0)), visits
