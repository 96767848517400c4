"""cluster.balance on every rank: which rows each training worker gets in the next epoch.

With "speed", each worker's rate (rows per second of its own work: compute and data, not the time it
waits for the others) is measured on the job's own epochs and kept as a moving figure; in a job of
several machines, workers on one machine compete for its cores, so each takes its machine's mean rate,
and shares move between machines, not between workers that share cores. At an epoch's end the shares
move to the rates when that shortens the predicted epoch by more than TOLERANCE, so a machine's noise
does not move rows (and re-read them) every epoch. A prediction can be wrong (workers that share cores
without sharing a host name, a link that slows with bigger messages): the first epoch on moved shares is
measured against the epoch before the move, and a move that did not shorten it by more than GAIN is
taken back and the shares before it held for HOLD epochs before the rates are followed again. A move is
judged by a warm epoch only: a process's first epoch pays for its start (first steps, allocations), so a
job resumed between a move and its judgment judges it by its second epoch. Every rank decides alike from
the same gathered figures; the figures, the shares and the pending judgment are part of each rank's
checkpoint, so a resumed job trains its next epoch on the shares the interrupted one would have used and
judges its moves alike.
"""

from __future__ import annotations

import math

from shoal.data.balance import RowShares, check_speeds, equal_plan, plan_from_shares, weighted_plan
from shoal.train.loop import EpochStats

SMOOTHING = 0.5
"""Weight of the newest epoch in the moving rate (the rest is the figure before it)."""
TOLERANCE = 0.05
"""Shares move only when the busiest worker's predicted time drops by more than this fraction."""
GAIN = 0.01
"""A move is kept only when its first warm epoch is shorter than the warm epoch before it by more than this
fraction (the epoch's time without re-reading rows); otherwise the shares before it come back."""
HOLD = 5
"""Epochs the shares a move was taken back to are held before the rates may move them again."""


def rate(stats: EpochStats) -> float:
    """Rows per second of a worker's own work in one epoch (0.0 when it measured none)."""
    busy = stats.compute + stats.data - stats.reading
    return stats.rows / busy if busy > 0 and stats.rows > 0 else 0.0


def machine_rates(rates: list[float], hosts: list[str] | None) -> list[float]:
    """Each worker's rate as its machine's mean over the workers that measured one (0.0 where none did).

    Workers of one machine share its cores: what one gains another loses, so only the machine's figure
    means anything, and equal figures keep their shares equal while the machine's total follows its speed.
    A job on one machine has no other to move rows to: its workers keep their own rates (each may have a
    device of its own)."""
    if hosts is None or len(set(hosts)) < 2:
        return list(rates)
    measured: dict[str, list[float]] = {}
    for value, host in zip(rates, hosts, strict=True):
        if value > 0:
            measured.setdefault(host, []).append(value)
    means = {host: math.fsum(values) / len(values) for host, values in measured.items()}
    return [means.get(host, 0.0) for host in hosts]


def epoch_seconds(per_trainer: list[EpochStats]) -> float:
    """The epoch's length as every rank sees it: the slowest trainer's seconds, less re-reading a moved share
    (a cost of the move, paid once, not of the shares)."""
    return max(stats.seconds - stats.reading for stats in per_trainer)


class Balancer:
    """The plan of the coming epoch, the measured rates it follows, and the judgment of its last move."""

    def __init__(self, balance: str | list[float], rows: int, trainers: int, batch_size: int, same_steps: bool,
                 hosts: list[str] | None = None):
        """`hosts`: each training worker's machine, in worker order (None: every worker a machine of its own)."""
        self.mode = "fixed" if isinstance(balance, list) else balance
        self.rows, self.batch_size, self.same_steps, self.hosts = rows, batch_size, same_steps, hosts
        self.rates: list[float] | None = None
        self.previous: tuple[int, ...] | None = None
        """The shares before a move whose first warm epoch is still to come (a move being judged)."""
        self.before: float | None = None
        """Seconds of the latest warm epoch on the present shares: what a move made now is judged against."""
        self.hold = 0
        """Epochs left before the shares may move again (after a move was taken back)."""
        self.taken_back = False
        """Whether the latest epoch's figures took a move back (for its epoch_end record)."""
        if isinstance(balance, list):
            check_speeds(balance, trainers)
            self.plan = weighted_plan(rows, [float(speed) for speed in balance], batch_size, same_steps)
        elif balance == "speed":
            self.plan = weighted_plan(rows, [1.0] * trainers, batch_size, same_steps)
        else:
            self.plan = equal_plan(rows, trainers, batch_size)

    def observe(self, per_trainer: list[EpochStats], warm: bool = True) -> RowShares | None:
        """An epoch's figures, one per training worker in order; the next epoch's plan when the shares move
        (to the rates, or back to those before a move that did not pay). `warm`: False for the first epoch a
        process runs, whose time (its start included) never judges a move."""
        self.taken_back = False
        if self.mode != "speed":
            return None
        self.follow_rates(per_trainer)
        self.hold = max(self.hold - 1, 0)
        seconds = epoch_seconds(per_trainer)
        if self.previous is not None:
            if not warm:  # the move's judgment waits for a warm epoch on its shares
                return None
            if self.judge(seconds):
                return self.plan
        self.before = seconds
        if self.hold > 0 or not all(value > 0 for value in self.rates):  # held, or a worker measured nothing
            return None
        moved = weighted_plan(self.rows, self.rates, self.batch_size, self.same_steps)
        if busiest(list(moved.shares), self.rates) >= (1 - TOLERANCE) * busiest(list(self.plan.shares), self.rates):
            return None
        self.previous, self.plan = self.plan.shares, moved
        return self.plan

    def follow_rates(self, per_trainer: list[EpochStats]) -> None:
        """The moving rates, each worker's its machine's, from one epoch's figures."""
        measured = machine_rates([rate(stats) for stats in per_trainer], self.hosts)
        before = self.rates or [0.0] * len(measured)
        self.rates = [old if new <= 0 else new if old <= 0 else SMOOTHING * new + (1 - SMOOTHING) * old
                      for new, old in zip(measured, before)]

    def judge(self, seconds: float) -> bool:
        """The first warm epoch on moved shares took `seconds`: whether the move is taken back (and the shares
        before it held for HOLD epochs)."""
        previous, self.previous = self.previous, None
        if self.before is None or seconds < (1 - GAIN) * self.before:
            return False
        self.plan = plan_from_shares(list(previous), self.batch_size, self.same_steps)
        self.before, self.hold, self.taken_back = None, HOLD, True
        return True

    def state_dict(self) -> dict:
        return {"shares": list(self.plan.shares), "rates": self.rates, "hold": self.hold, "before": self.before,
                "previous": list(self.previous) if self.previous is not None else None}

    def load_state_dict(self, state: dict | None) -> None:
        """A checkpoint's shares and rates, and the judgment under way (a checkpoint written before shares could
        move holds none; one written before moves were judged holds no judgment: none is under way)."""
        if not state or self.mode == "equal":
            return
        self.rates = state["rates"]
        if list(state["shares"]) != list(self.plan.shares):
            self.plan = plan_from_shares(list(state["shares"]), self.batch_size, self.same_steps)
        previous = state.get("previous")
        self.previous = tuple(previous) if previous is not None else None
        self.before, self.hold = state.get("before"), int(state.get("hold", 0))


def busiest(shares: list[int], rates: list[float]) -> float:
    """Seconds the slowest worker needs for its share at these rates: the epoch's predicted length."""
    return max(rows / speed for rows, speed in zip(shares, rates))
