"""While this node's workers run: stop them as soon as the attempt failed elsewhere or the job ended.

A worker on another machine that dies usually makes this node's workers fail too, but not
always at once (a parameter server waiting for messages, a peer whose link was cut makes a
collective wait for `cluster.timeout`). The launcher watches the job's store instead, from a
thread beside torch's agent: another node's failure flag, or the job's end, stops this node's
workers within a moment; losing the store itself (the first machine gone) does too. In a job of
changing machines the leader's watch also tells the workers that machines wait to join.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import torch.distributed as dist

from shoal.cluster import keys
from shoal.cluster.node.launch import SHUTDOWN_SECONDS, stop_workers
from shoal.cluster.node.membership import ElasticMeeting
from shoal.cluster.node.rendezvous import Meeting
from shoal.cluster.store import STORE_ERRORS
from shoal.errors import first_line

WATCH_SECONDS = 0.25
GRACE_SECONDS = 1.0


class AttemptWatch:
    """A context manager around one attempt's launch; `stopped` and `lost` say what it did."""

    def __init__(self, meeting: Meeting, attempt: int, interval: float = WATCH_SECONDS):
        self.meeting, self.interval = meeting, interval
        self.keys = [keys.attempt(attempt, "failed"), keys.END]
        self.alive = keys.node(meeting.node_rank, "alive")
        # the leader of a job of changing machines: machines asking to join the next attempt
        self.next = attempt + 1 if isinstance(meeting, ElasticMeeting) and meeting.leader else None
        self.stopped = False  # it stopped the workers: their failure is a consequence
        self.lost: str | None = None  # why the job's store could no longer be reached
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> AttemptWatch:
        store = self.meeting.watcher_store()
        self._thread = threading.Thread(target=self._run, args=(store,), name="shoal-attempt-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self, store: dist.Store) -> None:
        while not self._done.wait(self.interval):
            try:
                store.add(self.alive, 1)  # this launcher is there: the leader need not wait long for a gone one
                self._tell_arrivals(store)
                if not any(store.check([key]) for key in self.keys):
                    continue
            except STORE_ERRORS as error:
                self.lost = first_line(error)
            break
        began = time.monotonic()
        while not self._done.wait(self.interval):  # until the agent is done: some may not have started yet
            self._beat(store)  # still there while its workers stop, however long they take
            waited = time.monotonic() - began
            if waited < GRACE_SECONDS:  # workers that fail of themselves report their own error
                continue
            number = signal.SIGKILL if waited > GRACE_SECONDS + SHUTDOWN_SECONDS else signal.SIGTERM
            self.stopped = stop_workers(number) > 0 or self.stopped

    def _beat(self, store: dist.Store) -> None:
        if self.lost is None:
            with contextlib.suppress(*STORE_ERRORS):
                store.add(self.alive, 1)

    def _tell_arrivals(self, store: dist.Store) -> None:
        """Machines wait to join: the workers stop together at their next epoch's end (shoal.cluster.regroup)."""
        if self.next is not None and self.meeting.arrivals(self.next, store):
            self.meeting.worker_store.set(keys.REGROUP, "1")
            self.next = None

    def __exit__(self, *exception) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
