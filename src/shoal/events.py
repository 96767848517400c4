"""The run's event stream: one typed record per line in RUN_DIR/events.jsonl.

Every kind of record is one dataclass here, written through `EventLog` and read back through
`read_history`: the progress display, `shoal status`, reports, `shoal.fit`'s result, studies
and benchmarks read attributes, never keys, so a field is added or renamed in one place. It sits
below every other layer because the launcher (which knows why a worker failed), the workers and
the readers all speak it. Each record is flushed as it is written: a reader never waits for the
job to end. A full disk is one line (`EventsFull`) on every process that meets it, never a torn record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import json
import math
import os
import sys
import threading
import time
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from shoal.errors import ShoalError
from shoal.safe_files import open_file

EVENTS_FILE = "events.jsonl"
KIND_KEY = "event"  # on disk, the record's kind sits beside its fields under this key
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
UNKNOWN = "?"
"""What a record read without its field holds there (a worker's host, the job's end status): never shown."""
"""A full disk, a full quota, the process's file size limit (RLIMIT_FSIZE): no restart makes room."""


@dataclass(kw_only=True)
class Event:
    """What every record has: its kind (the class) and when it was written (unix seconds)."""

    kind: ClassVar[str] = ""
    time: float | None = None

    def record(self) -> dict:
        """The record as stored: `{"event": kind, "time": ..., fields...}`; a field not known (None) is left out,
        in its parts too (a worker's `validation` in a job without one)."""
        fields = _known(dataclasses.asdict(self))
        return {KIND_KEY: self.kind, **fields}


def _known(value: Any) -> Any:
    """`value` without the None fields of the records nested in it (dicts in lists: a record's parts)."""
    if isinstance(value, list):
        return [{key: item for key, item in part.items() if item is not None} if isinstance(part, dict) else part
                for part in value]
    if isinstance(value, dict):
        return {name: _known(item) for name, item in value.items() if item is not None}
    return value


# ---------------------------------------------------------------- parts of records


@dataclass(kw_only=True)
class SecondsSplit:
    """Where an epoch's time went, the mean over the training workers (evaluation: the coordinator's)."""

    compute: float = 0.0
    communication: float = 0.0
    data: float = 0.0
    evaluation: float = 0.0

    def parts(self) -> dict[str, float]:
        """Part name -> seconds, in the order the report stacks them."""
        return dataclasses.asdict(self)


SPLIT_PARTS = tuple(part.name for part in dataclasses.fields(SecondsSplit))


def known_host(host: str | None) -> str | None:
    """The host as recorded; None for a record without one."""
    return host if host and host != UNKNOWN else None


@dataclass(kw_only=True)
class WorkerEpoch:
    """One training worker's share of an epoch."""

    rank: int = 0
    host: str = UNKNOWN
    rows: int = 0
    seconds: float = 0.0
    steps_per_second: float = 0.0
    compute: float = 0.0
    communication: float = 0.0
    data: float = 0.0
    rate: float = 0.0
    """Rows per second of its own work (compute and data, not waits for others): what speed shares follow."""
    share: float = 0.0
    """Its fraction of the epoch's rows."""
    validation: dict[str, float] | None = None
    """With train.validation_split: its model's metrics on the rows it holds out (and `rows`, their count)."""


@dataclass(kw_only=True)
class WorkerMemory:
    """A worker's resident bytes before its data was loaded and at its peak. On a GPU the peak also holds the
    pages of the CUDA libraries that the first steps load, not the data's (some 240 MB more than on the CPU: an
    H200, torch 2.11)."""

    before_data: int = 0
    peak: int = 0


# ---------------------------------------------------------------- the kinds


@dataclass(kw_only=True)
class JobStart(Event):
    """The coordinator is up: the job, where it runs, and the epoch training starts from."""

    kind: ClassVar[str] = "job_start"
    from_epoch: int = 0
    versions: dict[str, str] = field(default_factory=dict)
    job: str | None = None
    config: dict = field(default_factory=dict)
    world_size: int | None = None
    trainers: int | None = None
    hosts: list[str] = field(default_factory=list)
    threads: int | None = None
    device: str | None = None
    algorithm: str | None = None
    train_rows: int | None = None
    test_rows: int | None = None
    steps_per_epoch: int | None = None
    parameters: int | None = None

    def resumed(self) -> JobResumed:
        """The same details as written by a coordinator that goes on from a checkpoint."""
        return JobResumed(**{part.name: getattr(self, part.name) for part in dataclasses.fields(self)})

    def configured_epochs(self) -> int | None:
        """`train.epochs` of the job as it started (the config is the resolved job file's content); None where
        a damaged record holds no count."""
        train = self.config.get("train") if isinstance(self.config, dict) else None
        epochs = train.get("epochs") if isinstance(train, dict) else None
        valid = isinstance(epochs, int) and not isinstance(epochs, bool) and 0 < epochs < INTEGER_LIMIT
        return epochs if valid else None


@dataclass(kw_only=True)
class JobResumed(JobStart):
    """A coordinator started again from a checkpoint (a restart or `--resume`); repeats job_start's details."""

    kind: ClassVar[str] = "job_resumed"
    resharded_from: int | None = None
    """Where the checkpoint was resharded (every rank took rank 0's state: a resume on another number of
    workers than the one that wrote it, or ranks that held no file of it), the number that wrote it;
    `world_size` is the new one. None for an exact resume."""


@dataclass(kw_only=True)
class DataLoaded(Event):
    """Every worker holds its share: the slowest load, each rank's, and what each holds."""

    kind: ClassVar[str] = "data_loaded"
    seconds: float = 0.0
    per_rank: list[float] = field(default_factory=list)
    shares: list[dict] = field(default_factory=list)


@dataclass(kw_only=True)
class Progress(Event):
    """The step the coordinator is at, every few seconds within an epoch."""

    kind: ClassVar[str] = "progress"
    epoch: int = 0
    step: int = 0
    step_in_epoch: int = 0
    steps_per_epoch: int | None = None
    loss: float | None = None


@dataclass(kw_only=True)
class EpochEnd(Event):
    """An epoch trained (numbered from 1): totals over the training ranks, test metrics when evaluated."""

    kind: ClassVar[str] = "epoch_end"
    epoch: int = 0
    step: int = 0
    train_loss: float = 0.0
    test: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    seconds: float = 0.0
    samples_per_second: float = 0.0
    seconds_split: SecondsSplit = field(default_factory=SecondsSplit)
    workers: list[WorkerEpoch] = field(default_factory=list)
    algorithm: dict | None = None
    """The algorithm's own report (a server's updates and staleness), when it has one."""
    balance: str | None = None
    """cluster.balance as it shared this epoch's rows: "equal", "speed" or "fixed" (a list of speeds)."""
    next_shares: list[int] | None = None
    """With speed shares: each training worker's rows for the next epoch, when they change."""
    taken_back: bool | None = None
    """With speed shares: True when `next_shares` are the shares before the latest move, taken back because the
    first epoch on the moved shares was no shorter than the one before it (they are held a few epochs)."""
    train_metrics: dict[str, float] | None = None
    """The numbers the user's training step logged (train.step), each a mean over every trainer's rows."""
    validation: dict[str, float] | None = None
    """With train.validation_split: the metrics on every worker's held-out rows, each worker's weighted by
    its rows (every replica of sync is the same model; other algorithms' replicas differ)."""
    learning_rates: list[float] | None = None
    """The learning rate of each of train.optimizer's param groups, in group order, as the epoch began: the rate
    it trained with under a schedule stepped per epoch (one stepped per step moves it within the epoch). Rank 0's
    optimizer's: every rank's schedule steps alike, and a Downpour server's optimizer is the one that steps."""


@dataclass(kw_only=True)
class Checkpoint(Event):
    kind: ClassVar[str] = "checkpoint"
    epoch: int = 0
    path: str = ""
    seconds: float | None = None


@dataclass(kw_only=True)
class Validation(Event):
    """Test metrics of a background validation, after `count` steps or server updates."""

    kind: ClassVar[str] = "validation"
    count: int = 0
    test: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(kw_only=True)
class WorkerFailed(Event):
    """The root cause of a failed attempt, as the launcher found it."""

    kind: ClassVar[str] = "worker_failed"
    rank: int | None = None
    host: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    message: str | None = None

    def text(self) -> str:
        """`rank 1 (host) exit code -9 (SIGKILL): message`, with only what the record holds: a node's own failure
        has no rank, a worker that raised or went silent no exit code (its message says what happened)."""
        host = known_host(self.host)
        if self.rank is None:
            who = host or "a worker"
        else:
            who = f"rank {self.rank}" + (f" ({host})" if host else "")
        if self.exit_code is not None:
            who += f" exit code {self.exit_code}" + (f" ({self.signal})" if self.signal else "")
        elif self.signal:
            who += f" stopped by {self.signal}"
        elif not self.message:
            who += ", exit code not recorded"
        return who + (f": {self.message}" if self.message else "")

    def text_before(self) -> str:
        """The text of this record as shoal wrote it into a job's end before 2026-11-29 (`?` for what it lacked):
        what an older run's `job_end` message holds."""
        signal = f" ({self.signal})" if self.signal else ""
        message = f": {self.message}" if self.message else ""
        rank = "?" if self.rank is None else self.rank
        exit_code = "?" if self.exit_code is None else self.exit_code
        return f"rank {rank} ({self.host or '?'}) exit code {exit_code}{signal}{message}"


@dataclass(kw_only=True)
class JobRestarted(Event):
    """The launcher starts the workers again from the newest checkpoint."""

    kind: ClassVar[str] = "job_restarted"
    restart: int = 0
    from_epoch: int = 0
    epochs_redone: int | None = None


@dataclass(kw_only=True)
class Membership(Event):
    """The machines of a job whose size may change (`--nnodes MIN:MAX`) as an attempt begins: who is in,
    who left or joined since the last attempt and why, and where training goes on from."""

    kind: ClassVar[str] = "membership"
    attempt: int = 0
    hosts: list[str] = field(default_factory=list)
    """Each machine in the job now, in node order."""
    workers: list[int] = field(default_factory=list)
    """Each machine's worker count, in the order of `hosts`."""
    world_size: int = 0
    left: list[str] = field(default_factory=list)
    joined: list[str] = field(default_factory=list)
    reason: str = ""
    from_epoch: int = 0
    """The checkpoint's epoch the new membership trains on from (0: the start)."""
    shares: list[int] | None = None
    """Each training worker's rows in the next epoch (equal shares over the new world size)."""


@dataclass(kw_only=True)
class JobEnd(Event):
    """The job is over: `completed` (with the final metrics and the model) or `failed`/`interrupted` and why."""

    kind: ClassVar[str] = "job_end"
    status: str = UNKNOWN
    message: str | None = None
    test: dict[str, float] | None = None
    seconds: float | None = None
    epochs: int | None = None
    steps: int | None = None
    model: str | None = None
    memory: list[WorkerMemory] | None = None
    traceback: str | None = None
    """A failure in the user's own code (a step, transform, metric, callback): its traceback as Python prints
    it, with the user's file names and line numbers (its last lines; absent in older runs)."""

    @property
    def completed(self) -> bool:
        return self.status == "completed"


KINDS: dict[str, type[Event]] = {kind.kind: kind for kind in (
    JobStart, JobResumed, DataLoaded, Progress, EpochEnd, Checkpoint, Validation, WorkerFailed, JobRestarted,
    Membership, JobEnd)}


# ---------------------------------------------------------------- writing


class EventsFull(ShoalError):
    """The disk (or the quota, or the file size limit) filled up as a record was written: the record is not in
    the file, and nothing half-written is either."""


class EventLog:
    """Appends records to a run's events file; safe to share with a background thread and other processes.

    Each record is strict JSON on a line of its own: a non-finite number (a NaN metric) is stored
    as null, and a line torn by a writer that died mid-record is cut off before the next record,
    which would otherwise be glued to it and lost. Writers of one file take turns through `flock`
    on it (the launcher appends while the coordinator writes), so none mistakes another's record
    in progress for a torn one. A record is one write of its whole line; one that fails or falls
    short (a full disk) is cut off again before the turn passes on, and a full disk is `EventsFull`.
    """

    def __init__(self, run_dir: str | Path, listeners: Sequence[Callable[[Event], None]] = ()):
        """`listeners`: called with each record once it is on disk (rank 0's loggers), so what they
        show is what the file holds."""
        self.run_dir = run_dir
        self.path = Path(run_dir) / EVENTS_FILE
        try:  # never through a link planted where the events belong: it would append to its target
            descriptor = open_file(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        except OSError as error:
            raise (self._full(os.strerror(error.errno)) if error.errno in FULL else error) from None
        self._handle = os.fdopen(descriptor, "ab+", buffering=0)
        self._lock = threading.Lock()  # the background validation writes too
        self.listeners = list(listeners)

    def write(self, event: Event) -> Event:
        """Stamp the event with the time, append it, and make it durable; the stamped event."""
        event = dataclasses.replace(event, time=round(time.time(), 3))
        line = json.dumps(_finite(event.record()), default=_plain, allow_nan=False) + "\n"
        descriptor = self._handle.fileno()
        with self._lock:
            turn = _take_turn(descriptor)
            try:
                _cut_torn_line(descriptor)
                self._append(descriptor, line.encode("utf-8"))
            finally:
                if turn:
                    fcntl.flock(descriptor, fcntl.LOCK_UN)
        for listener in self.listeners:
            listener(event)
        return event

    def _append(self, descriptor: int, data: bytes) -> None:
        """One record, durable, in one write (the file's turn is held); on a failure or a short write the file
        is cut back to its size before it, so no reader or later writer ever sees part of it."""
        size = os.fstat(descriptor).st_size
        try:
            written = os.write(descriptor, data)
            if written == len(data):
                os.fsync(descriptor)
        except OSError as error:
            with contextlib.suppress(OSError):  # shrinking needs no space; a later writer cuts a torn line anyway
                os.ftruncate(descriptor, size)
            if error.errno in FULL:
                raise self._full(os.strerror(error.errno)) from None
            raise
        if written < len(data):  # only a full disk or a file size limit writes part of a line
            with contextlib.suppress(OSError):
                os.ftruncate(descriptor, size)
            raise self._full(f"{written} of the record's {len(data)} bytes written")

    def _full(self, reason: str) -> EventsFull:
        return EventsFull(f"{self.path}: no room for the run's next record ({reason}): free some space, then "
                          f"resume the run (shoal train --resume {self.run_dir})")

    def close(self) -> None:
        self._handle.close()


def append_event(run_dir: str | Path, event: Event) -> Event:
    """Append one record to an existing run's events (the launcher's failure records)."""
    log = EventLog(run_dir)
    try:
        return log.write(event)
    finally:
        log.close()


def _finite(value: Any) -> Any:
    """The record with every NaN and infinity as None (JSON has no such numbers: they are written as null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _plain(value: Any) -> Any:
    """numpy scalars and other stragglers as plain JSON values."""
    if hasattr(value, "item"):
        return _finite(value.item())
    return str(value)


def _take_turn(descriptor: int) -> bool:
    """Wait for the other writers of the file; False on a filesystem without locks (writing goes on unguarded)."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
    except OSError:
        return False
    return True


def _cut_torn_line(descriptor: int) -> None:
    """Truncate the file back to its last newline: a last line without one is a record its writer never finished."""
    size = os.fstat(descriptor).st_size
    if size == 0 or os.pread(descriptor, 1, size - 1) == b"\n":
        return
    end = size
    while end > 0:
        start = max(0, end - 65536)
        newline = os.pread(descriptor, end - start, start).rfind(b"\n")
        if newline >= 0:
            os.ftruncate(descriptor, start + newline + 1)
            return
        end = start
    os.ftruncate(descriptor, 0)


# ---------------------------------------------------------------- reading


def read_events(run_dir: str | Path) -> Iterator[dict]:
    """The records as stored, oldest first; a half-written last line (a live job) is skipped."""
    for _, record in _numbered_lines(Path(run_dir) / EVENTS_FILE):
        if isinstance(record, dict):
            yield record


NOT_JSON = object()  # a line that does not parse


def _numbered_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number from 1, parsed line or NOT_JSON); a last line without its newline (a record still
    being written) is left out."""
    if not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                yield number, json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                if line.endswith("\n"):
                    yield number, NOT_JSON


def parse(record: dict) -> Event | None:
    """A stored record as its dataclass; None for a kind this version does not know.

    Unknown fields are ignored and missing ones take their defaults, so runs written by older
    or newer versions (and hand-written test records) still read.
    """
    name = record.get(KIND_KEY)
    kind = KINDS.get(name) if isinstance(name, str) else None
    return None if kind is None else _build(kind, record)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, values: dict):
    hints = _hints(cls)
    known = {part.name: _value(hints[part.name], values[part.name])
             for part in dataclasses.fields(cls) if part.init and part.name in values}
    return cls(**known)


def _value(hint: Any, value: Any) -> Any:
    """Nested records (a dataclass, or a list of them) built from their dicts; a null where a number
    belongs (stored for a NaN or an infinity) as NaN; anything else as stored."""
    if isinstance(hint, types.UnionType):  # `X | None`: X
        hint = _optional(hint)
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return _build(hint, value)
    if hint is float:
        return math.nan if value is None else value
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin is dict and arguments[1:] == (float,) and isinstance(value, dict):
        return {key: math.nan if item is None else item for key, item in value.items()}
    if origin is list and arguments and isinstance(value, list):
        if dataclasses.is_dataclass(arguments[0]):
            return [_build(arguments[0], item) if isinstance(item, dict) else item for item in value]
        if arguments[0] is float:
            return [math.nan if item is None else item for item in value]
    return value


EventType = TypeVar("EventType", bound=Event)


@dataclass
class History:
    """A run's events, oldest first, with the questions its readers ask of them."""

    events: list[Event]
    last_time: float | None = None
    """When the newest record was written, of whatever kind (one from a newer shoal counts too)."""

    def of(self, kind: type[EventType]) -> list[EventType]:
        """Every event of a kind (exactly that kind: JobStart does not match JobResumed)."""
        return [event for event in self.events if type(event) is kind]

    def last(self, kind: type[EventType]) -> EventType | None:
        found = self.of(kind)
        return found[-1] if found else None

    @property
    def start(self) -> JobStart | None:
        """The job's details as they were most recently: job_start, or a later job_resumed."""
        return next((event for event in reversed(self.events)
                     if isinstance(event, JobStart) and event.job is not None), None)

    @property
    def end(self) -> JobEnd | None:
        return self.last(JobEnd)

    @property
    def epochs(self) -> list[EpochEnd]:
        """Every epoch_end, an epoch redone after a restart included."""
        return self.of(EpochEnd)

    def latest_epochs(self) -> list[EpochEnd]:
        """One epoch_end per epoch, the last one written: an epoch redone after a restart replaces
        the earlier attempt, whose weights the job threw away."""
        by_epoch = {event.epoch: event for event in self.epochs}
        return [by_epoch[epoch] for epoch in sorted(by_epoch)]

    def reached_epoch(self) -> int:
        """The highest epoch that ended, 0 before the first."""
        return max((event.epoch for event in self.epochs), default=0)

    def started(self) -> bool:
        """Whether the job wrote job_start already (a coordinator starting again writes job_resumed)."""
        return bool(self.of(JobStart))


def read_history(run_dir: str | Path, warn: bool = True) -> History:
    """A run's typed events; a folder without an events file is a user error. A malformed record (a
    hand-edited or damaged file) is skipped, with a line on stderr naming it when `warn`."""
    path = Path(run_dir) / EVENTS_FILE
    if not path.is_file():
        raise ShoalError(f"{run_dir}: no {EVENTS_FILE}: not a shoal run directory")
    events, times = [], []
    for number, record in _numbered_lines(path):
        problem = record_problem(record)
        if problem is not None:
            if warn:
                print(f"shoal: warning: {path}: line {number}: skipped: {problem}", file=sys.stderr)
            continue
        if record.get("time") is not None:
            times.append(record["time"])
        event = parse(record)
        if event is not None:
            events.append(event)
    return History(events, times[-1] if times else None)


# ---------------------------------------------------------------- checking what is read

INTEGER_LIMIT = 2**63  # what a record's integers stay below (TOML's and torch's too)


def record_problem(record: Any) -> str | None:
    """Why a stored line cannot be read as its kind's record, in words; None when it can.

    A kind this version does not know passes (a newer shoal's); a field it knows must hold its type."""
    if record is NOT_JSON:
        return "not JSON"
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__.replace('NoneType', 'null')}, not a record"
    name = record.get(KIND_KEY)
    kind = KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        return None if isinstance(name, str) else f"'{KIND_KEY}' must be a kind's name, got {_shown(name)}"
    found = _fields_mismatch(kind, record)
    config = record.get("config")
    if found is None and issubclass(kind, JobStart) and isinstance(config, dict) \
            and not isinstance(config.get("train", {}), dict):  # the section the readers look into
        found = ".config.train", "a table", config["train"]
    if found is None:
        return None
    where, expected, value = found
    return f"{name}{where} must be {expected}, got {_shown(value)}"


Mismatch = tuple[str, str, Any]
"""Where in a record (".workers[0].rank"), what belongs there, and what is there instead."""


def _fields_mismatch(cls: type, values: dict) -> Mismatch | None:
    hints = _hints(cls)
    for part in dataclasses.fields(cls):
        if part.init and part.name in values:
            found = _mismatch(hints[part.name], values[part.name])
            if found is not None:
                return f".{part.name}{found[0]}", found[1], found[2]
    return None


def _mismatch(hint: Any, value: Any) -> Mismatch | None:
    """Where `value` fails `hint` (a field's annotation), or None when it fits."""
    if isinstance(hint, types.UnionType):  # `X | None`
        return None if value is None else _mismatch(_optional(hint), value)
    if dataclasses.is_dataclass(hint):
        return ("", "a table", value) if not isinstance(value, dict) else _fields_mismatch(hint, value)
    origin, arguments = typing.get_origin(hint) or hint, typing.get_args(hint)
    if origin is list:
        if not isinstance(value, list):
            return "", "a list", value
        entries = enumerate(value)
        item = arguments[0] if arguments else Any
    elif origin is dict:
        if not isinstance(value, dict):
            return "", "a table", value
        entries = value.items()
        item = arguments[1] if len(arguments) == 2 else Any
    else:
        return None if _scalar_fits(hint, value) else ("", _scalar_name(hint), value)
    for key, entry in entries:
        found = _mismatch(item, entry)
        if found is not None:
            return f"[{json.dumps(key)}]{found[0]}", found[1], found[2]
    return None


def _optional(hint: Any) -> Any:
    """X of an `X | None` annotation."""
    return next(argument for argument in typing.get_args(hint) if argument is not type(None))


def _scalar_fits(hint: Any, value: Any) -> bool:
    """A float field also holds null (stored for NaN or infinity) and integers a float can hold."""
    if hint is float:
        if value is None or isinstance(value, float):
            return True
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**1023
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < INTEGER_LIMIT
    if hint in (str, bool):
        return isinstance(value, hint)
    return True  # Any, or a type this reader does not check


def _scalar_name(hint: Any) -> str:
    return {float: "a number", int: "an integer below 2**63", str: "text", bool: "true or false"}.get(hint, "a value")


def _shown(value: Any) -> str:
    """A stored value, cut short: a line may be long."""
    text = json.dumps(value) if not (isinstance(value, int) and abs(value) >= INTEGER_LIMIT) else "a huge integer"
    return text if len(text) <= 40 else text[:37] + "..."
