"""cluster.balance on every rank: which rows each training worker gets in the next epoch.

With "speed", each worker's rate (rows per second of its own work: compute and data, not the time it
waits for the others) is measured on the job's own epochs and kept as a moving figure; at an epoch's
end the shares move to the rates when that shortens the predicted epoch by more than TOLERANCE, so a
machine's noise does not move rows (and re-read them) every epoch. Every rank decides alike from the
same gathered figures; the figures and the shares are part of each rank's checkpoint, so a resumed job
trains its next epoch on the shares the interrupted one would have used.
"""

from __future__ import annotations

from shoal.data.balance import Plan, check_speeds, equal_plan, plan_from_shares, weighted_plan
from shoal.train.loop import EpochStats

SMOOTHING = 0.5
"""Weight of the newest epoch in the moving rate (the rest is the figure before it)."""
TOLERANCE = 0.05
"""Shares move only when the busiest worker's predicted time drops by more than this fraction."""


def rate(stats: EpochStats) -> float:
    """Rows per second of a worker's own work in one epoch (0.0 when it measured none)."""
    busy = stats.compute + stats.data - stats.reading
    return stats.rows / busy if busy > 0 and stats.rows > 0 else 0.0


class Balancer:
    """The plan of the coming epoch, and the measured rates it follows."""

    def __init__(self, balance: str | list[float], rows: int, trainers: int, batch_size: int, same_steps: bool):
        self.mode = "fixed" if isinstance(balance, list) else balance
        self.rows, self.batch_size, self.same_steps = rows, batch_size, same_steps
        self.rates: list[float] | None = None
        if isinstance(balance, list):
            check_speeds(balance, trainers)
            self.plan = weighted_plan(rows, [float(speed) for speed in balance], batch_size, same_steps)
        elif balance == "speed":
            self.plan = weighted_plan(rows, [1.0] * trainers, batch_size, same_steps)
        else:
            self.plan = equal_plan(rows, trainers, batch_size)

    def observe(self, per_trainer: list[EpochStats]) -> Plan | None:
        """An epoch's figures, one per training worker in order; the next epoch's plan when the shares move."""
        if self.mode != "speed":
            return None
        measured = [rate(stats) for stats in per_trainer]
        before = self.rates or [0.0] * len(measured)
        self.rates = [old if new <= 0 else new if old <= 0 else SMOOTHING * new + (1 - SMOOTHING) * old
                      for new, old in zip(measured, before)]
        if not all(value > 0 for value in self.rates):  # a worker that measured nothing: nothing to follow
            return None
        moved = weighted_plan(self.rows, self.rates, self.batch_size, self.same_steps)
        if busiest(list(moved.shares), self.rates) >= (1 - TOLERANCE) * busiest(list(self.plan.shares), self.rates):
            return None
        self.plan = moved
        return self.plan

    def state_dict(self) -> dict:
        return {"shares": list(self.plan.shares), "rates": self.rates}

    def load_state_dict(self, state: dict | None) -> None:
        """A checkpoint's shares and rates (a checkpoint written before shares could move holds none)."""
        if not state or self.mode == "equal":
            return
        self.rates = state["rates"]
        if list(state["shares"]) != list(self.plan.shares):
            self.plan = plan_from_shares(list(state["shares"]), self.batch_size, self.same_steps)


def busiest(shares: list[int], rates: list[float]) -> float:
    """Seconds the slowest worker needs for its share at these rates: the epoch's predicted length."""
    return max(rows / speed for rows, speed in zip(shares, rates))
