"""Which threads of this process wait for the other workers, and since when: what the stall inspector reads.

A worker whose training thread is deadlocked (in the user's code, or on a lock) still beats, since its
heartbeat thread is free; what tells it apart from the others is that they wait for it in a collective
while it does not wait at all. So every wait for the other workers is marked here as it begins and ends:
the Communicator's collectives and point-to-point messages, and the training loop's wait for the gradient
exchange's own thread (shoal.algorithms.exchange). The heartbeat reads the marks of the one thread it
watches, its training thread.

The marks are per thread (a thread writes only its own entries, and one item written into a dict is
atomic in CPython), so the hot path takes no lock: two clock reads and two dict writes per collective.
Waits do not nest: the thread that waits is blocked in torch, or on a future, until the wait ends.
"""

from __future__ import annotations

import threading
import time


class Waits:
    """When each thread entered the wait it is in, and when it last left one (time.monotonic, this machine)."""

    def __init__(self):
        self.entered: dict[int, float] = {}
        self.left: dict[int, float] = {}

    def enter(self) -> int:
        """The calling thread begins to wait; returns its identity, for `leave`."""
        thread = threading.get_ident()
        self.entered[thread] = time.monotonic()
        return thread

    def leave(self, thread: int) -> None:
        """Thread `thread` (the one that called `enter`) waits no longer."""
        self.left[thread] = time.monotonic()
        self.entered.pop(thread, None)

    def waiting(self, thread: int, now: float) -> float | None:
        """Seconds thread `thread` has waited at `now` in the wait it is in, or None when it does not wait."""
        entered = self.entered.get(thread)
        return None if entered is None else max(now - entered, 0.0)

    def last_left(self, thread: int) -> float | None:
        """When thread `thread` last left a wait (None: never)."""
        return self.left.get(thread)


WAITS = Waits()
"""This process's marks: its Communicators and the gradient exchange write them, its heartbeat reads them."""
