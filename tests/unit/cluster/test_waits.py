"""The marks of each thread's wait for the others, as the Communicator's collectives leave them."""

from __future__ import annotations

import threading
import time

import pytest

from shoal.cluster.collectives import Communicator
from shoal.cluster.waits import WAITS, Waits


def test_a_wait_is_marked_for_its_own_thread_only():
    waits = Waits()
    other = threading.Thread(target=lambda: None)
    other.start()
    other.join()
    thread = waits.enter()
    assert thread == threading.get_ident() and waits.waiting(thread, time.monotonic()) >= 0
    assert waits.waiting(other.ident, time.monotonic()) is None and waits.last_left(thread) is None
    waits.leave(thread)
    assert waits.waiting(thread, time.monotonic()) is None and waits.last_left(thread) <= time.monotonic()


def test_a_collective_marks_its_thread_waiting_while_it_runs_and_not_after():
    seen = []

    def collective(group=None):
        seen.append(WAITS.waiting(threading.get_ident(), time.monotonic()))

    Communicator(0, 2)._timed(collective)
    assert seen[0] is not None and WAITS.waiting(threading.get_ident(), time.monotonic()) is None


def test_a_collective_that_fails_leaves_no_mark():
    def collective(group=None):
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(RuntimeError):
        Communicator(0, 2)._timed(collective)
    assert WAITS.waiting(threading.get_ident(), time.monotonic()) is None
