"""Failures recorded without shoal's launcher: under torchrun, srun or mpirun the workers record them.

shoal's own launcher finds a failed attempt's root cause and writes it to events.jsonl. Other
launchers start the workers directly and see only exit codes, so the workers do it themselves:
each leaves its way out in the job's store (an error's first line, or the signal that stopped
it), and rank 0 (when it stops, or else rank 0 of the launcher's next attempt) reads them all,
names the cause and records the failure, the restart or the job's end, so that `shoal status`
tells the truth. A worker killed outright (SIGKILL, the out-of-memory killer) leaves nothing:
its silence is its record.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch.distributed as dist

from shoal.cluster import keys
from shoal.cluster.environments import named
from shoal.cluster.heartbeat import job_store, silence, verdict
from shoal.cluster.signals import call_on_stop
from shoal.cluster.store import STORE_ERRORS, Bounded, attempt_store
from shoal.cluster.verdict import Account, Kind, root_cause
from shoal.errors import torch_says
from shoal.events import JobEnd, JobRestarted, WorkerFailed, append_event, read_history
from shoal.train.checkpoint import newest_epoch

WAIT_SECONDS = 3.0
"""How long rank 0 waits for the others' exits (torchrun allows 30 s before SIGKILL, mpirun less)."""
STOP_SHARE = 0.5
"""The share of the launcher's grace between SIGTERM and SIGKILL that rank 0 spends listening."""
SETTLE_SECONDS = 0.5
"""Once a cause is known, how long rank 0 still listens for the rest."""
WITHOUT_A_WORD = "ended without a word (killed: SIGKILL, the out-of-memory killer, or a crash)"


@dataclass(frozen=True)
class Exit:
    """How one worker left an attempt."""

    rank: int
    host: str
    message: str | None = None
    """Its error's first line, when it raised one."""
    signal: str | None = None
    """The signal that stopped it, when one did."""
    consequence: bool = False
    """Its error came from a peer gone (as the worker judged it, by the error's type)."""
    traceback: str | None = None
    """Its error in the user's own code: the user's traceback (shoal.code.user_traceback)."""

    @property
    def own_error(self) -> bool:
        """It raised an error of its own making (not one that only followed a peer's loss)."""
        return bool(self.message) and not self.consequence

    @classmethod
    def of_error(cls, rank: int, host: str, message: str, traceback: str | None = None,
                 consequence: bool | None = None) -> Exit:
        """`consequence`: whether the error only followed a peer's loss (shoal.errors.lost_peer of the error);
        None where the error is known by its text alone: then only torch's words for a lost peer make it one."""
        consequence = torch_says(message) if consequence is None else consequence
        return cls(rank, host, message=message, consequence=consequence, traceback=traceback)


class ExitBook:
    """Where every worker of one attempt leaves its way out, in the job's store."""

    def __init__(self, store: dist.Store, attempt: int, world_size: int):
        """`store`: torch's; every request is bounded here (over a cut link one would never return)."""
        self.raw, self.world_size, self.attempt = store, world_size, attempt
        self.store = Bounded(store)
        self.liveness = Bounded(attempt_store(store, attempt))  # the attempt's heartbeats and verdict

    def write(self, leaving: Exit) -> None:
        try:
            self.store.set(keys.exit_of(self.attempt, leaving.rank), json.dumps(asdict(leaving)))
        except STORE_ERRORS:  # the store is gone with the launcher: nobody is left to read it anyway
            pass

    def read(self) -> dict[int, Exit]:
        names = [keys.exit_of(self.attempt, rank) for rank in range(self.world_size)]
        try:
            present = [key for key in names if self.store.check([key])]
            return {leaving.rank: leaving for leaving in
                    (Exit(**json.loads(value)) for value in (self.store.multi_get(present) if present else []))}
        except STORE_ERRORS:
            return {}

    def claim(self) -> bool:
        """Whether this caller records the attempt's outcome: the first to ask does, once."""
        try:
            return self.store.add(keys.exit_of(self.attempt, "recorded"), 1) == 1
        except STORE_ERRORS:  # the store went with the launcher's round: better twice than never
            return True

    def wait(self, seconds: float = WAIT_SECONDS) -> dict[int, Exit]:
        """Every worker's exit, or as many as came within `seconds` (a little less once a cause is known)."""
        deadline = time.monotonic() + seconds
        while True:
            exits = self.read()
            if len(exits) == self.world_size or time.monotonic() >= deadline:
                return exits
            if any(leaving.own_error for leaving in exits.values()):
                deadline = min(deadline, time.monotonic() + SETTLE_SECONDS)
            time.sleep(0.1)

    def host_of(self, rank: int) -> str | None:
        """Where `rank` ran, from its heartbeat."""
        try:
            found = self.liveness.check([keys.beat(rank)])
            return json.loads(self.liveness.get(keys.beat(rank)))["host"] if found else None
        except (*STORE_ERRORS, KeyError, json.JSONDecodeError):
            return None


def cause(book: ExitBook, exits: dict[int, Exit]) -> WorkerFailed | None:
    """The failure to blame, or None when every worker was stopped from outside (an interrupt).

    By shoal.cluster.verdict's order: the worker found silent after a timeout, a worker's own error, a
    worker that left no word (killed outright), a worker's error that only followed a peer's loss."""
    try:
        silent = verdict(book.liveness)
    except STORE_ERRORS:
        silent = None
    found = [] if silent is None else [Account(Kind.SILENT, silent["rank"], silent["host"], silence(silent))]
    for leaving in sorted(exits.values(), key=lambda leaving: leaving.rank):
        if leaving.message:  # a worker with only a signal was stopped from outside: no account
            kind = Kind.RAISED if leaving.own_error else Kind.FOLLOWED
            found.append(Account(kind, leaving.rank, leaving.host, leaving.message))
    gone = [rank for rank in range(book.world_size) if rank not in exits]
    found += [Account(Kind.KILLED, rank, message=WITHOUT_A_WORD) for rank in gone]
    blamed = root_cause(found)
    if blamed is None:
        return None
    host = book.host_of(blamed.rank) if blamed.kind is Kind.KILLED else blamed.host  # asked only when needed
    return WorkerFailed(rank=blamed.rank, host=host, message=blamed.message)


def record_outcome(run_dir: Path, book: ExitBook, exits: dict[int, Exit], *, restarts_left: int, launcher: str,
                   restarting: bool = False) -> None:
    """Rank 0: the attempt's failure in events.jsonl, and the job's end unless the launcher restarts it
    (`restarts_left` after a failure; `restarting`: the restart is under way already)."""
    if not book.claim():
        return
    failure = cause(book, exits)
    if failure is None:
        if not restarting:
            signals = sorted({leaving.signal for leaving in exits.values() if leaving.signal}) or ["a signal"]
            append_event(run_dir, JobEnd(status="interrupted",
                                         message=f"stopped by {', '.join(signals)} (from {launcher} or its scheduler)"))
        return
    append_event(run_dir, failure)
    if restarts_left <= 0 and not restarting:
        blamed = exits.get(failure.rank)  # the user's traceback, when the cause is an error in the user's code
        traceback = blamed.traceback if blamed is not None and blamed.message == failure.message else None
        append_event(run_dir, JobEnd(status="failed", message=failure.text(), traceback=traceback))


def restart_record(run_dir: Path, restart: int) -> JobRestarted:
    """Restart number `restart`, from the newest checkpoint: what `job_restarted` says (shoal's own launcher
    writes it too)."""
    from_epoch = newest_epoch(run_dir)
    reached = read_history(run_dir).reached_epoch()
    return JobRestarted(restart=restart, from_epoch=from_epoch, epochs_redone=max(reached + 1 - from_epoch, 0))


def record_restart(run_dir: Path, store: dist.Store, restarts: int, world_size: int, launcher: str) -> None:
    """Rank 0 of the launcher's restart number `restarts`: the last attempt's failure, if rank 0 could not
    record it then (it was the one killed), and the restart itself."""
    previous = ExitBook(store, restarts - 1, world_size)
    record_outcome(run_dir, previous, previous.read(), restarts_left=0, launcher=launcher, restarting=True)
    append_event(run_dir, restart_record(run_dir, restarts))


class Recorder:
    """One worker's part when no shoal launcher watches: leave its exit; rank 0 records the outcome."""

    def __init__(self, store: dist.Store, info):
        self.info, self.restarts_left = info, max(info.max_restarts - info.restarts, 0)
        self.book = ExitBook(store, info.restarts, info.world_size)
        self.run_dir: Path | None = None  # rank 0's, once the job has one
        self.leaving: int | None = None  # the exit status once this worker leaves of its own accord
        self.lock = threading.Lock()  # one way out: a stop signal waits for a failure being recorded
        self.left = False

    def started(self, run_dir: Path) -> None:
        """The run directory is known; after a restart by the launcher, rank 0 records it."""
        self.run_dir = run_dir
        if self.info.rank == 0 and self.info.restarts:
            record_restart(run_dir, self.book.raw, self.info.restarts, self.info.world_size, self.launcher)

    @property
    def launcher(self) -> str:
        return self.info.launcher or "the launcher"

    def stopped(self, signal_name: str) -> int | None:
        """A stop signal arrived (the launcher stops the others after a failure, or the job was cancelled):
        rank 0 listens for the others only for part of the launcher's grace before its SIGKILL. Once the
        worker leaves of its own accord (see `leave_quietly`), the signal changes nothing; its status."""
        if self.leaving is not None:
            return self.leaving
        self.leave(Exit(self.info.rank, self.info.host, signal=signal_name),
                   wait=min(WAIT_SECONDS, STOP_SHARE * self.info.stop_grace))
        return None

    def leave_quietly(self, status: int) -> None:
        """This worker ends the job by design (a stop for requeue): a stop signal from now on is expected."""
        self.leaving = status

    def failed(self, message: str, traceback: str | None = None, consequence: bool | None = None) -> None:
        """This worker raised: its error's first line, the user's traceback if any, and whether the error only
        followed a peer's loss (see Exit.of_error)."""
        self.leave(Exit.of_error(self.info.rank, self.info.host, message, traceback, consequence))

    def leave(self, leaving: Exit, wait: float = WAIT_SECONDS) -> None:
        """Once per worker (an error, then the launcher's SIGTERM, is one way out): write this worker's exit;
        rank 0 then records the outcome, its own exit known even when the store is gone."""
        with self.lock:
            if self.left:
                return
            self.left = True
            self.book.write(leaving)
            if self.info.rank == 0 and self.run_dir is not None:
                exits = self.book.wait(wait)
                exits.setdefault(leaving.rank, leaving)
                record_outcome(self.run_dir, self.book, exits, restarts_left=self.restarts_left,
                               launcher=self.launcher)


def outside_recorder(info) -> Recorder | None:
    """This worker's recorder under torchrun, srun or mpirun; None alone or under shoal's launcher (which
    records failures itself). From here on, a stop signal is recorded the moment it arrives."""
    if info.launcher is None or named(info.launcher).records_failures:
        return None
    recorder = Recorder(job_store(info), info)
    call_on_stop(lambda number: recorder.stopped(number.name))
    return recorder
