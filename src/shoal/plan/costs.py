"""The arithmetic of communication: what each pattern sends, and what a link charges for it.

Pure functions, no torch and no measurement, so that every figure `shoal plan` prints can be
checked by hand: a link costs a fixed time per message plus bytes over bandwidth; a ring
all-reduce of B bytes over N ranks is 2(N-1) rounds of B/N bytes each; a parameter server is
a closed queue (its trainers come back after their own work) solved exactly by mean value
analysis; and two linear cost curves cross where their fixed and per-row costs balance.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """One network path as the planner prices it: a message costs `latency` seconds (the wire's latency plus
    the software's per-message work: a waiting process woken, a call made) plus its bytes over `bandwidth` (bytes
    per second, the rate an exchange reaches), the two fitted apart to messages of several sizes. A measured
    link keeps its measured points (bytes -> seconds per message) to show what the line was fitted to; a
    profile saved before the line priced links (format 2) is still priced through them (`interpolated`):
    between two points in proportion, below the smallest at its time, beyond the largest bandwidth alone
    adding."""

    latency: float
    bandwidth: float
    points: tuple[tuple[int, float], ...] = ()
    interpolated: bool = False

    def seconds(self, size: float) -> float:
        """One message of `size` bytes, end to end."""
        if not (self.interpolated and self.points):
            return self.latency + size / self.bandwidth
        sizes = [point for point, _ in self.points]
        if size <= sizes[0]:
            return self.points[0][1]
        index = bisect.bisect_left(sizes, size)
        if index == len(sizes):
            last, seconds = self.points[-1]
            return seconds + (size - last) / self.bandwidth
        (low, low_seconds), (high, high_seconds) = self.points[index - 1], self.points[index]
        return low_seconds + (high_seconds - low_seconds) * (size - low) / (high - low)

    @property
    def measured(self) -> bool:
        """Whether it was measured (a described or assumed link has no points)."""
        return bool(self.points)


@dataclass(frozen=True)
class Exchange:
    """What one collective makes every rank do: `rounds` messages in sequence, `size` bytes each."""

    rounds: int
    size: float

    @property
    def bytes_sent(self) -> float:
        """Bytes every rank sends (and receives) in the whole collective."""
        return self.rounds * self.size

    def seconds(self, link: Link) -> float:
        return self.rounds * link.seconds(self.size) if self.rounds else 0.0


def ring_all_reduce(size: float, ranks: int) -> Exchange:
    """A ring all-reduce of `size` bytes: a reduce-scatter then an all-gather, N-1 rounds each of B/N bytes."""
    if ranks <= 1:
        return Exchange(0, 0.0)
    return Exchange(2 * (ranks - 1), size / ranks)


def hierarchical_all_reduce(size: float, nodes: int, per_node: int, inside: Link, across: Link) -> float:
    """A flat ring over nodes x per_node ranks placed node by node: each round every rank sends B/N to the
    next, and a round lasts as long as its slowest hop (across machines once nodes > 1)."""
    exchange = ring_all_reduce(size, nodes * per_node)
    return exchange.seconds(across if nodes > 1 else inside)


@dataclass(frozen=True)
class Queue:
    """A closed queue's steady state: `cycle` seconds between one client's requests, `throughput` requests
    per second served in all, `waiting` seconds a request spends at the stations (queueing and service)."""

    cycle: float
    throughput: float
    waiting: float


def closed_queue(services: list[float], think: float, clients: int) -> Queue:
    """Mean value analysis (Reiser and Lavenberg) of `clients` that each work `think` seconds, then visit
    every station in `services` once (one server each, that many seconds of service per visit)."""
    queued = [0.0] * len(services)
    waiting, throughput = 0.0, 0.0
    for population in range(1, clients + 1):
        residence = [service * (1 + length) for service, length in zip(services, queued)]
        waiting = sum(residence)
        throughput = population / (think + waiting)
        queued = [throughput * time for time in residence]
    return Queue(cycle=think + waiting, throughput=throughput, waiting=waiting)


@dataclass(frozen=True)
class Line:
    """A cost that grows linearly with the dataset: `fixed` seconds plus `per_row` seconds per row."""

    fixed: float
    per_row: float

    def at(self, rows: float) -> float:
        return self.fixed + self.per_row * rows


def crossover(smaller: Line, larger: Line) -> float | None:
    """Rows from which `larger` (more machines) is faster than `smaller`; None if it never is, 0 if always."""
    saved_per_row = smaller.per_row - larger.per_row
    extra = larger.fixed - smaller.fixed
    if extra <= 0:
        return 0.0 if saved_per_row >= 0 else None
    if saved_per_row <= 0:
        return None
    return extra / saved_per_row
