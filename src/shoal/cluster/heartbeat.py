"""Liveness: each worker beats into the job's store every second and listens to the others' beats.

When a collective times out, the rank that reports the error is rarely the one at fault: the
one that stopped answering is. A background thread beats, so a worker blocked in a collective
(waiting, alive) keeps beating while a stopped, wedged or cut-off one falls silent. The beats
live in the store every rank already reaches (MASTER_ADDR), not in files on a shared disk, and
each worker judges silence by when *it* last saw another's beat change, on its own clock:
nothing compares the clocks of different machines. The first worker to time out records its
verdict in the store, where shoal's launcher reads it.

A collective waits `cluster.timeout` (300 s by default) before it fails, far too long to notice a
worker that is alive but not answering. So the thread also keeps watch: a rank heard before whose
beats have stopped for `cluster.stall_timeout` (30 s by default) is hung, whatever the collectives
allow. The thread records it as the verdict and hands it to the worker (`on_stall`), which leaves
its collective as a worker that lost a peer does: its launcher then ends the attempt. A busy worker
is never taken for hung (its thread beats on while it computes), nor is one that says it is leaving
(its own error, or a stop by design): only a process that stopped altogether (SIGSTOP, frozen while
holding the interpreter's lock, cut off) falls silent.

A worker whose training thread is deadlocked (in the user's code, on a lock) beats on, so silence never
names it. Each beat therefore also says what that thread is doing: its phase ("train" inside the epoch's
step loop), how long it has waited in its current wait for the others (a collective: shoal.cluster.waits),
or else how long it has been busy at one step. A worker whose own training thread has waited
`cluster.stall_timeout` in a collective looks for the rank that trains, does not wait, and has been busy
at one step that long (shoal.cluster.inspector, which also says what it never takes for a stall); it
records that rank as the verdict and leaves, as for silence. Silence is looked for first.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

from shoal.cluster import inspector, keys
from shoal.cluster.env import DistInfo
from shoal.cluster.store import STORE_ERRORS, Bounded, attempt_store, client, worker_sealed
from shoal.cluster.waits import WAITS
from shoal.errors import WorkerError

HEARTBEAT_SECONDS = 1.0
LEAVE_SECONDS = 1.0  # the leaving beat, sent at once: a cut link must not hold a worker on its way out
SILENT_KEY = keys.SILENT
beat_key = keys.beat
STARTING = "starting"  # the phase of a worker until its runner says otherwise


def silence(beat: dict) -> str:
    """How a silent rank's last beat reads in a message: `stopped answering at step S (no heartbeat for N s)`;
    a stuck one's (see shoal.cluster.inspector): `stopped making progress at step S (busy outside ...)`."""
    if "busy_for" in beat:
        return inspector.description(beat)
    text = "stopped answering " + ("before its first step" if beat["step"] is None else f"at step {beat['step']}")
    seconds = beat.get("silent_for")
    return f"{text} (no heartbeat for {seconds:.0f} s)" if isinstance(seconds, (int, float)) else text


def read_beat(value: bytes, rank: int) -> dict | None:
    """Rank `rank`'s beat as a worker writes it, or None for anything else (never heard, never judged)."""
    try:
        beat = json.loads(value)
    except ValueError:
        return None
    valid = (isinstance(beat, dict) and beat.get("rank") == rank and isinstance(beat.get("host"), str)
             and type(beat.get("count")) is int and (beat.get("step") is None or type(beat["step"]) is int)
             and isinstance(beat.get("phase", ""), str)
             and is_seconds(beat.get("waiting")) and is_seconds(beat.get("busy")))
    return beat if valid else None


def is_seconds(value) -> bool:
    """Whether `value` is a beat's figure of seconds: a number that is not negative, or null."""
    if value is None:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


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
    store = attempt_store(job_store(info), info.restarts)
    return store if isinstance(store, dist.HashStore) else worker_sealed(store)


class Heartbeat:
    """Beats as `rank` and hears every other rank, from a daemon thread, every `interval` seconds.

    With `stall_timeout` the thread also keeps watch: the first rank it finds silent or stuck that long (see
    `stalled`) is recorded as the verdict, or the verdict another worker recorded first is taken, and
    that is handed to `on_stall`, once. The beats tell of the training thread `watched` (by default the
    thread that makes the Heartbeat): its waits (shoal.cluster.waits) and the phase it enters."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, host: str,
                 interval: float = HEARTBEAT_SECONDS, stall_timeout: float | None = None,
                 on_stall: Callable[[dict], None] | None = None, watched: int | None = None):
        self.store, self.rank, self.world_size, self.host, self.interval = store, rank, world_size, host, interval
        self.stall_timeout, self.on_stall = stall_timeout, on_stall
        self.watched = threading.get_ident() if watched is None else watched
        self.step = 0
        self.phase = STARTING
        self.moved = time.monotonic()  # when the step or the phase last changed (the step as the beats saw it)
        self.beaten_step = self.step  # the step the last beat carried
        self.count = 0
        self.leaving = False  # on its way out: no peer may take its end for a hang
        self.stall: dict | None = None  # the verdict handed to on_stall
        self.heard: dict[int, tuple[float, dict]] = {}  # rank -> (when its beat last changed here, the beat)
        self.started = self.listened = time.monotonic()  # listened: when this worker last heard the store
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="shoal-heartbeat", daemon=True)
        self._thread.start()

    def beat(self, step: int) -> None:
        """Note the step reached (cheap: the thread sends it)."""
        self.step = step

    def enter_phase(self, phase: str) -> None:
        """The training thread enters `phase` (inspector.TRAIN inside the epoch's step loop; cheap)."""
        self.phase, self.moved = phase, time.monotonic()

    def activity(self, now: float) -> dict:
        """What the watched thread is doing, as a beat says it: its phase, and the seconds it has waited in its
        current wait or, when it does not wait, been busy since its step, its phase or its last wait changed."""
        if self.step != self.beaten_step:
            self.beaten_step, self.moved = self.step, now
        waited = WAITS.waiting(self.watched, now)
        if waited is not None:
            return {"phase": self.phase, "waiting": round(waited, 1), "busy": None}
        since = max(self.moved, WAITS.last_left(self.watched) or self.moved)
        return {"phase": self.phase, "waiting": None, "busy": round(max(now - since, 0.0), 1)}

    def _next(self) -> str:
        with self._lock:  # the thread and `leave` both beat
            self.count += 1
            beat = {"rank": self.rank, "host": self.host, "step": self.step, "count": self.count,
                    **self.activity(time.monotonic())}
        return json.dumps({**beat, "leaving": True} if self.leaving else beat)

    def _beat(self) -> None:
        self.store.set(beat_key(self.rank), self._next())

    def _listen(self) -> None:
        """Note, on this machine's clock, each rank whose beat changed since the last look."""
        ranks = [rank for rank in range(self.world_size) if rank in self.heard or self.store.check([beat_key(rank)])]
        values = self.store.multi_get([beat_key(rank) for rank in ranks]) if ranks else []
        now = time.monotonic()
        for rank, value in zip(ranks, values):
            beat = read_beat(value, rank)
            # a count that rises: an older beat of the same attempt played again is no sign of life
            if beat is not None and (rank not in self.heard or beat["count"] > self.heard[rank][1]["count"]):
                self.heard[rank] = (now, beat)
        self.listened = now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat()
                self._listen()
            except (*STORE_ERRORS, OSError, WorkerError):
                # the store out of reach, or a value in it the job did not make, must not end training;
                # nor is anyone judged on what this worker could not hear
                continue
            self._watch()

    def _watch(self) -> None:
        """With a stall timeout: a rank stalled that long is recorded and handed to `on_stall`, once."""
        if self.stall_timeout is None or self.stall is not None or self.leaving:  # leaving: its own way out
            return
        quiet = self.stalled()
        recorded = self.record(quiet) if quiet is not None else None
        if recorded is None:  # none, or the store did not take it: judged again at the next beat
            return
        self.stall = recorded
        if self.on_stall is not None:
            self.on_stall(recorded)

    def stalled(self) -> dict | None:
        """The rank hung for `stall_timeout`: heard before, silent since (a rank never heard is left to the
        collectives' own timeout: at the start the others may not have begun to beat yet); else the rank
        `stuck` while this one waits for it."""
        if self.stall_timeout is None:
            return None
        return self.silent(self.stall_timeout, heard_only=True) or self.stuck()

    def stuck(self) -> dict | None:
        """When this worker's training thread has waited `stall_timeout` in its current wait: the rank that, by
        its beats, has been busy training at one step as long (shoal.cluster.inspector.stuck), or None."""
        waited = WAITS.waiting(self.watched, time.monotonic())
        if self.stall_timeout is None or self.world_size < 2 or waited is None or waited < self.stall_timeout:
            return None
        beats = {rank: beat for rank, (_, beat) in self.heard.items() if rank != self.rank}
        beats[self.rank] = {"rank": self.rank, "phase": self.phase, "waiting": round(waited, 1)}
        return inspector.stuck(beats, self.stall_timeout)

    def silent(self, gap: float, heard_only: bool = False) -> dict | None:
        """The beat of the rank heard from longest ago, with `silent_for` (seconds) added, when that was `gap`
        seconds or more before this worker last heard the store (so a worker that cannot reach it blames
        nobody); a rank never heard counts from when listening began, unless `heard_only`. A rank whose last
        beat says it is leaving is not silent. Every rank of a machine cut off falls silent together: the
        first of them is named."""
        if self.world_size < 2:
            return None
        last = []
        for rank in range(self.world_size):
            heard = self.heard.get(rank)
            if rank == self.rank or (heard is None and heard_only):
                continue
            when, beat = heard or (self.started, {"rank": rank, "host": "?", "step": None})
            if not beat.get("leaving"):
                last.append((when, beat))
        if not last:
            return None
        quiet_time, quiet = min(last, key=lambda heard: heard[0])
        seconds = self.listened - quiet_time
        return {**quiet, "silent_for": round(seconds, 1)} if seconds >= gap else None

    def record(self, quiet: dict) -> dict | None:
        """Record `quiet` as the attempt's verdict unless one is there; the verdict the store then holds, or
        None when it could not be reached."""
        try:  # bounded: over a cut link the request would never return
            return json.loads(Bounded(self.store).compare_set(SILENT_KEY, "", json.dumps(quiet)))
        except (*STORE_ERRORS, WorkerError):  # out of reach, or a value there the job did not make
            return None

    def blame(self, gap: float = 2 * HEARTBEAT_SECONDS) -> dict | None:
        """After a collective timed out: the silent rank, recorded once in the store for the launcher."""
        quiet = self.silent(gap)
        if quiet is not None:
            self.record(quiet)
        return quiet

    def leave(self) -> None:
        """This worker is on its way out (its own error, the job's end, a stop by design): its beats say so
        from now on, the first at once, so that no peer takes its end for a hang."""
        if self.leaving:
            return
        self.leaving = True
        try:
            Bounded(self.store, LEAVE_SECONDS).set(beat_key(self.rank), self._next())
        except STORE_ERRORS:  # the next beat says it
            pass

    def close(self) -> None:
        self.leave()
        self._stop.set()

    @property
    def beating(self) -> bool:
        """Whether the thread still beats (tests: a failing rank must beat on while it tears down)."""
        return self._thread.is_alive() and not self._stop.is_set()
