"""Shares of an epoch's rows sized to each worker's speed, and the batches that cut them.

An uneven cluster trains as fast as its slowest worker when every worker gets an equal share: the
fast ones finish early and wait. The epoch's plan, `RowShares`, gives training worker i `shares[i]`
rows (contiguous, in worker order, so each still reads only its own files and row groups) and
`steps[i]` steps. Two kinds of plan, because algorithms meet differently:

- same steps (synchronous SGD, a synchronous server, sub-masters): every worker runs `nominal`
  steps and its batches split its share evenly, so a worker twice as fast takes batches twice as
  large; the global batch stays `trainers * batch_size` rows;
- own steps (averaging, EASGD, an asynchronous server): batches of at most `batch_size` rows, so a
  worker twice as fast takes twice the steps; collective algorithms count their rounds on the
  `nominal` clock (the steps an equal share takes), so every worker still enters each round.

Pure functions of integers and floats, like `partition`: every rank computes the same plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shoal.data.partition import batch_bounds, share, steps_per_epoch
from shoal.errors import ConfigError, DataError


@dataclass(frozen=True)
class RowShares:
    """Rows and steps of every training worker for one epoch."""

    shares: tuple[int, ...]
    """Rows of each training worker, in worker order; they sum to the dataset's rows."""
    steps: tuple[int, ...]
    """Steps each training worker runs this epoch."""
    nominal: int
    """Steps an equal share takes at the batch size: the clock collective algorithms count rounds on."""
    batch_size: int
    equal: bool = False
    """The plan of cluster.balance = "equal": the first rows % trainers workers hold one row more, every
    worker runs `nominal` steps and the last batch takes the remainder (as shoal always did)."""

    def range(self, index: int) -> tuple[int, int]:
        """Row range [start, stop) of training worker `index`."""
        start = sum(self.shares[:index])
        return start, start + self.shares[index]

    def bounds(self, index: int) -> list[tuple[int, int]]:
        """[lo, hi) positions in worker `index`'s epoch order, one per step."""
        rows, steps = self.shares[index], self.steps[index]
        if self.equal:
            return batch_bounds(rows, steps, self.batch_size)
        return [share(rows, steps, step) for step in range(steps)]

    def largest_batch(self, index: int) -> int:
        """The batch size a loader's memory plan allows for (an equal plan's last batch may be a row more)."""
        if self.equal:
            return self.batch_size
        return max(hi - lo for lo, hi in self.bounds(index))


def nominal_steps(rows: int, trainers: int, batch_size: int) -> int:
    """Steps per epoch of a worker holding an equal share (at least one, at most the smallest equal share's
    rows: a same-steps plan gives every worker a row a step)."""
    return max(1, min(math.ceil(rows / (trainers * batch_size)), rows // trainers))


def equal_plan(rows: int, trainers: int, batch_size: int) -> RowShares:
    """Equal shares, every worker the same steps: cluster.balance = "equal"."""
    steps = steps_per_epoch(rows, trainers, batch_size)
    shares = tuple(stop - start for start, stop in (share(rows, trainers, rank) for rank in range(trainers)))
    return RowShares(shares, (steps,) * trainers, steps, batch_size, equal=True)


def proportional(rows: int, weights: list[float], minimum: int = 1) -> list[int]:
    """`rows` split in proportion to `weights`, each share at least `minimum` rows, summing to `rows` exactly.

    Shares go by largest remainder (ties to the lower index), so each is within one row of its exact
    proportion; a worker whose proportion falls below `minimum` gets `minimum` and the others share the rest."""
    if not weights or any(not (math.isfinite(w) and w > 0) for w in weights):
        raise ValueError(f"weights must be positive and finite, got {weights!r}")
    if rows < minimum * len(weights):
        raise DataError(f"the dataset has {rows} rows: too few for {len(weights)} workers of at least "
                        f"{minimum} row(s) each")
    held: set[int] = set()  # workers raised to the minimum
    while True:
        free = [index for index in range(len(weights)) if index not in held]
        parts = largest_remainder(rows - minimum * len(held), [weights[index] for index in free])
        low = {index for index, part in zip(free, parts) if part < minimum}
        if not low:
            shares = dict(zip(free, parts)) | dict.fromkeys(held, minimum)
            return [shares[index] for index in range(len(weights))]
        held |= low


def largest_remainder(rows: int, weights: list[float]) -> list[int]:
    """`rows` in proportion to `weights`: the floors, then one more row to the largest remainders."""
    if not weights:
        return []
    total = math.fsum(weights)
    exact = [rows * weight / total for weight in weights]
    parts = [math.floor(value) for value in exact]
    for index in sorted(range(len(weights)), key=lambda i: (parts[i] - exact[i], i))[: rows - sum(parts)]:
        parts[index] += 1
    return parts


def weighted_plan(rows: int, weights: list[float], batch_size: int, same_steps: bool) -> RowShares:
    """Shares in proportion to `weights` (relative speeds, one per training worker)."""
    minimum = nominal_steps(rows, len(weights), batch_size) if same_steps else 1  # same steps: a row a step
    return plan_from_shares(proportional(rows, weights, minimum), batch_size, same_steps)


def plan_from_shares(shares: list[int], batch_size: int, same_steps: bool) -> RowShares:
    """The plan of given shares (decided from speeds, or read back from a checkpoint)."""
    nominal = nominal_steps(sum(shares), len(shares), batch_size)
    steps = [nominal] * len(shares) if same_steps else [math.ceil(rows / batch_size) for rows in shares]
    return RowShares(tuple(shares), tuple(steps), nominal, batch_size)


def check_speeds(balance, trainers: int) -> None:
    """cluster.balance as a list: one relative speed per training worker."""
    if isinstance(balance, list) and len(balance) != trainers:
        raise ConfigError(f"cluster.balance: {len(balance)} speeds given for {trainers} training workers; give one "
                          "per training worker, in rank order")


def nominal_crossed(step_in_epoch: int, steps: int, nominal: int) -> range:
    """The nominal steps (1..nominal) that local step `step_in_epoch` (from 1) of `steps` completes.

    A worker with more steps than the nominal clock completes none on some steps; one with fewer may
    complete several at once; every worker completes each nominal step exactly once an epoch."""
    return range((step_in_epoch - 1) * nominal // steps + 1, step_in_epoch * nominal // steps + 1)
