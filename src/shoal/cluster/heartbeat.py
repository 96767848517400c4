"""Liveness: each worker beats into the job's store every second and listens to the others' beats.

When a collective times out, the rank that reports the error is rarely the one at fault: the
one that stopped answering is. A background thread beats, so a worker blocked in a collective
(waiting, alive) keeps beating while a stopped, wedged or cut-off one falls silent. The beats
live in the store every rank already reaches (MASTER_ADDR), not in files on a shared disk, and
each worker judges silence by when *it* last saw another's beat change, on its own clock:
nothing compares the clocks of different machines. The first worker to time out records its
verdict in the store, where shoal's launcher reads it.
"""

from __future__ import annotations

import json
import os
import threading
import time

import torch.distributed as dist

from shoal.cluster import keys
from shoal.cluster.env import DistInfo
from shoal.cluster.store import STORE_ERRORS, Bounded, Sealed, attempt_store, client, worker_secret

HEARTBEAT_SECONDS = 1.0
SILENT_KEY = keys.SILENT
beat_key = keys.beat


def silence(beat: dict) -> str:
    """How a silent rank's last beat reads in a message: `stopped answering at step S`."""
    return "stopped answering " + ("before its first step" if beat["step"] is None else f"at step {beat['step']}")


def verdict(store: dist.Store | None) -> dict | None:
    """The beat of the worker the first to time out found silent (see Heartbeat.blame), if one did."""
    if store is None or not store.check([SILENT_KEY]):
        return None
    return json.loads(store.get(SILENT_KEY))


def job_store(info: DistInfo) -> dist.Store:
    """A connection of this worker's own to the job's store; a private one when alone or without one."""
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if info.world_size > 1 and address and port:
        try:
            return client(address, int(port))
        except (RuntimeError, ValueError):  # no store after all: liveness stays local
            pass
    return dist.HashStore()


def liveness_store(info: DistInfo) -> dist.Store:
    """Where this worker beats and listens: the job's store, in this attempt's keys (under the job's secret
    when shoal's launcher handed one: its launcher reads the verdict there)."""
    store, secret = attempt_store(job_store(info), info.restarts), worker_secret()
    return Sealed(store, secret) if secret and not isinstance(store, dist.HashStore) else store


class Heartbeat:
    """Beats as `rank` and hears every other rank, from a daemon thread, every `interval` seconds."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, host: str,
                 interval: float = HEARTBEAT_SECONDS):
        self.store, self.rank, self.world_size, self.host, self.interval = store, rank, world_size, host, interval
        self.step = 0
        self.count = 0
        self.heard: dict[int, tuple[float, dict]] = {}  # rank -> (when its beat last changed here, the beat)
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="shoal-heartbeat", daemon=True)
        self._thread.start()

    def beat(self, step: int) -> None:
        """Note the step reached (cheap: the thread sends it)."""
        self.step = step

    def _beat(self) -> None:
        self.count += 1
        self.store.set(beat_key(self.rank), json.dumps({"rank": self.rank, "host": self.host, "step": self.step,
                                                         "count": self.count}))

    def _listen(self) -> None:
        """Note, on this machine's clock, each rank whose beat changed since the last look."""
        ranks = [rank for rank in range(self.world_size) if rank in self.heard or self.store.check([beat_key(rank)])]
        values = self.store.multi_get([beat_key(rank) for rank in ranks]) if ranks else []
        now = time.monotonic()
        for rank, value in zip(ranks, values):
            beat = json.loads(value)
            if rank not in self.heard or self.heard[rank][1]["count"] != beat["count"]:
                self.heard[rank] = (now, beat)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat()
                self._listen()
            except (*STORE_ERRORS, OSError):  # the store out of reach must not end training
                pass

    def silent(self, gap: float) -> dict | None:
        """The beat of the rank heard from longest ago, when that was `gap` seconds or more before the
        latest beat heard (this worker's own); a rank never heard counts from when listening began.
        Every rank of a machine cut off falls silent together: the first of them is named."""
        if self.world_size < 2:
            return None
        last = {rank: self.heard.get(rank, (self.started, {"rank": rank, "host": "?", "step": None}))
                for rank in range(self.world_size) if rank != self.rank}
        quiet_time, quiet = min(last.values(), key=lambda heard: heard[0])
        return quiet if time.monotonic() - quiet_time >= gap else None

    def blame(self, gap: float = 2 * HEARTBEAT_SECONDS) -> dict | None:
        """After a collective timed out: the silent rank, recorded once in the store for the launcher."""
        quiet = self.silent(gap)
        if quiet is not None:
            try:  # bounded: over a cut link the request would never return
                Bounded(self.store).compare_set(SILENT_KEY, "", json.dumps(quiet))
            except STORE_ERRORS:
                pass
        return quiet

    def close(self) -> None:
        self._stop.set()

    @property
    def beating(self) -> bool:
        """Whether the thread still beats (tests: a failing rank must beat on while it tears down)."""
        return self._thread.is_alive() and not self._stop.is_set()
