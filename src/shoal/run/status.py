"""Where a job stands, from its events file alone: `shoal status RUN_DIR [--watch]`.

The coordinator may be on another machine or long gone, so nothing here talks to a process:
the summary is a fold over `events.jsonl`, and it works the same for a live, a finished and a
crashed run. A run that ended without anyone writing `job_end` (its launcher killed, or a full
disk) is told apart by its lock: the launcher holds RUN_DIR/.lock for the whole job, and the
kernel lets go of it however the launcher ends (`shoal.run.lock.held`, which only looks).
Where no lock says (a run written before it, a filesystem without locks), by silence: a live job
records something every few seconds, and no rank of it waits longer than its own
`cluster.timeout` before the job fails and says so.
"""

from __future__ import annotations

import math
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from shoal.config import ClusterConfig
from shoal.errors import ShoalError, first_line
from shoal.events import (
    EVENTS_FILE,
    UNKNOWN,
    Checkpoint,
    DataLoaded,
    EpochEnd,
    Event,
    JobEnd,
    JobRestarted,
    JobResumed,
    JobStart,
    Membership,
    Progress,
    WorkerEpoch,
    WorkerFailed,
    known_host,
    read_history,
)
from shoal.run.directory import JOB_FILE
from shoal.run.lock import held

STALL_SECONDS = 120
"""A run without `job_end` whose last record is older than this shows as `stalled?` (a live job
records its progress every few seconds; an evaluation or a checkpoint can take longer)."""
STOP_GRACE_SECONDS = 60
"""Beyond `cluster.timeout`: the time a failing job's launcher takes to record the failure."""
START_SECONDS = 60
"""How long `--watch` waits for the events of a job whose job.toml is written."""
STOPPED = "stopped without an end record (the launcher was killed?)"
LAUNCHER_GONE = "stopped without an end record (its launcher is gone)"
"""What a run says whose lock nobody holds: no process of the job is left to write its end."""

MEMBERSHIP_LINES = 4
"""The most changes of machines shown one per line; beyond, the latest few and a count of the others."""

CLEAR_SCREEN = "\033[H\033[2J"
NOT_STARTED = "the job had not started: no job_start event yet"
UNKNOWN_STATUS = "ended (status not recorded)"
DEFAULT_TIMEOUT = ClusterConfig().timeout


@dataclass
class Timeline:
    """What the events say so far, folded oldest first; a restart, a resume or a change of machines rewinds
    the position."""

    start: JobStart = field(default_factory=JobStart)  # job_start, or the latest job_resumed (it repeats them)
    started_at: float | None = None
    end: JobEnd | None = None
    last_epoch: EpochEnd | None = None
    progress: Progress | None = None
    test: dict = field(default_factory=dict)
    test_epoch: int | None = None
    completed: int = 0
    epoch_seconds: list[float] = field(default_factory=list)
    epoch_began: float | None = None  # when the epoch in progress started: the pace before any epoch has ended
    restarts: list[JobRestarted] = field(default_factory=list)
    failures: list[WorkerFailed] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    moved: dict[int, list[int]] = field(default_factory=dict)
    """Epoch -> the next epoch's rows per training worker, for the epochs after which speed shares moved."""
    membership: list[Membership] = field(default_factory=list)
    """The machines of a job whose machines may change, as each attempt with other machines began."""
    machines_newer: bool = False
    """Whether the latest membership came after the latest job_start or job_resumed (whose world size and
    hosts are then the old machines')."""

    def add(self, event: Event) -> None:
        handler = HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def started(self, event: JobStart) -> None:
        self.start, self.end, self.epoch_began = event, None, event.time
        self.machines_newer = False
        self.started_at = event.time if self.started_at is None else self.started_at

    def loaded(self, event: DataLoaded) -> None:
        self.epoch_began = event.time

    def stepped(self, event: Progress) -> None:
        self.progress = event

    def epoch_ended(self, event: EpochEnd) -> None:
        self.last_epoch, self.completed, self.epoch_began = event, event.epoch, event.time
        self.epoch_seconds.append(event.seconds)
        if self.progress is not None and self.progress.epoch <= self.completed:
            self.progress = None
        if event.test:
            self.test, self.test_epoch = event.test, event.epoch
        if event.next_shares:
            self.moved[event.epoch] = event.next_shares
        else:  # an epoch redone after a restart that did not move them
            self.moved.pop(event.epoch, None)

    def shares_moved(self) -> list[int]:
        """The epochs so far after which the shares moved (an epoch lost to a restart does not count)."""
        return sorted(epoch for epoch in self.moved if epoch <= self.completed)

    def went_on(self, event: JobRestarted | JobResumed) -> None:
        """Training goes on from the checkpoint's epoch; the epoch in progress was lost."""
        if isinstance(event, JobRestarted):
            self.restarts.append(event)
        elif event.job is not None:
            self.start, self.machines_newer = event, False
        self.completed, self.progress, self.end, self.epoch_began = event.from_epoch, None, None, event.time

    def regrouped(self, event: Membership) -> None:
        """An attempt begins on other machines: training goes on from the checkpoint's epoch, as after a
        restart (the first machines of a job go on from the start, or a resumed job's checkpoint)."""
        self.membership.append(event)
        self.machines_newer = True
        self.completed, self.progress, self.end, self.epoch_began = event.from_epoch, None, None, event.time

    def machines(self) -> tuple[int | None, list[str]]:
        """The world size and the hosts now: the latest membership's until the coordinator restarted on them."""
        if self.machines_newer:
            latest = self.membership[-1]
            return latest.world_size or sum(latest.workers), sorted(set(latest.hosts))
        return self.start.world_size, sorted(set(self.start.hosts))

    def failed(self, event: WorkerFailed) -> None:
        self.failures.append(event)

    def checkpointed(self, event: Checkpoint) -> None:
        self.checkpoints.append(event)

    def ended(self, event: JobEnd) -> None:
        self.end, self.progress = event, None
        if event.test:
            self.test = event.test
            self.test_epoch = event.epochs if event.epochs is not None else self.completed

    def position(self) -> tuple[int, int, int | None, float]:
        """Epoch, step, steps per epoch and the fraction of the epoch under way."""
        steps_per_epoch = self.start.steps_per_epoch
        if self.progress is not None:
            steps_per_epoch = self.progress.steps_per_epoch or steps_per_epoch
            fraction = min(self.progress.step_in_epoch / steps_per_epoch, 1.0) if steps_per_epoch else 0.0
            return self.progress.epoch, self.progress.step, steps_per_epoch, fraction
        step = self.last_epoch.step if self.last_epoch else 0
        if self.end is not None and self.end.steps is not None:
            step = self.end.steps
        return self.completed, step, steps_per_epoch, 0.0

    def mean_epoch(self, fraction: float) -> float | None:
        """Seconds per epoch so far; in the first epoch, its pace so far."""
        if self.epoch_seconds:
            return sum(self.epoch_seconds) / len(self.epoch_seconds)
        if fraction > 0 and self.epoch_began is not None and self.progress.time is not None:
            return (self.progress.time - self.epoch_began) / fraction
        return None


HANDLERS = {JobStart: Timeline.started, DataLoaded: Timeline.loaded, Progress: Timeline.stepped,
            EpochEnd: Timeline.epoch_ended, Checkpoint: Timeline.checkpointed, WorkerFailed: Timeline.failed,
            JobRestarted: Timeline.went_on, JobResumed: Timeline.went_on, Membership: Timeline.regrouped,
            JobEnd: Timeline.ended}


@dataclass
class WorkerPace:
    rank: int
    host: str
    steps_per_second: float
    slowest: bool = False
    rate: float | None = None
    """Rows per second of its own work (compute and data, not waits for others); None where the record does
    not say (a run written before shares could follow speed)."""
    share: float | None = None
    """Its fraction of the epoch's rows; None where the record does not say."""


@dataclass
class MachinePace:
    """A machine's workers in the last epoch: their rows per second summed, and their share of the rows."""

    host: str
    workers: list[WorkerPace]
    rate: float | None
    """None when any of its workers' rates is unknown: a sum of part of them would be a wrong figure."""
    share: float | None


@dataclass
class Status:
    """The state of a run as plain data: progress, metrics, speed, ETA, workers, restarts."""

    run_dir: str
    state: str
    job: str | None
    algorithm: str | None
    world_size: int | None
    hosts: list[str]
    epoch: int
    epochs: int | None
    step: int
    step_in_epoch: int | None
    steps_per_epoch: int | None
    train_loss: float | None
    step_loss: float | None
    test: dict
    test_epoch: int | None
    samples_per_second: float | None
    mean_epoch_seconds: float | None
    eta_seconds: float | None
    elapsed_seconds: float | None
    last_event_seconds_ago: float
    workers: list[WorkerPace]
    restarts: int
    last_restart: JobRestarted | None
    failures: int
    last_failure: WorkerFailed | None
    checkpoints: int
    last_checkpoint: Checkpoint | None
    message: str | None
    silence_limit: float | None = None
    """Seconds without a record after which a run without `job_end` has stopped: its cluster.timeout and a grace."""
    balance: str | None = None
    """cluster.balance as the last epoch shared its rows ("equal", "speed", "fixed"); None for a run written
    before shares could differ."""
    shares_moved: list[int] = field(default_factory=list)
    """With speed shares: the epochs after which the shares moved."""
    membership: list[Membership] = field(default_factory=list)
    """In a job whose machines may change: its machines as each attempt with other machines began (the first:
    those it started on)."""
    started: bool = True
    """Whether the events hold a job_start (or a job_resumed): a run killed before has none."""
    last_epoch: EpochEnd | None = None
    """The last epoch's record: each worker's share of its rows, and the next epoch's when they moved."""

    @property
    def machines(self) -> list[MachinePace]:
        return machine_paces(self.workers)

    def shows_machines(self) -> bool:
        """Whether each machine's rate and share are worth a line: the record holds them, and there is more
        than one worker or the shares are not equal."""
        return (self.balance is not None and bool(self.workers) and (len(self.workers) > 1 or self.balance != "equal")
                and all(known_host(worker.host) for worker in self.workers))  # unknown hosts are no machine


def run_state(end: JobEnd | None, quiet_seconds: float, silence_limit: float = math.inf) -> str:
    if end is not None:
        return end.status if end.status and end.status != UNKNOWN else UNKNOWN_STATUS
    if quiet_seconds > silence_limit:
        return "stopped"
    return "stalled?" if quiet_seconds > STALL_SECONDS else "running"


def job_timeout(run_dir: Path, start: JobStart) -> float:
    """The job's cluster.timeout: from its job_start record, else its job.toml, else shoal's default."""
    cluster, where = start.config.get("cluster"), f"{run_dir / EVENTS_FILE}: job_start"
    if not (isinstance(cluster, dict) and "timeout" in cluster):
        cluster, where = job_file_table(run_dir, "cluster"), str(run_dir / JOB_FILE)
    timeout = cluster.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (math.isfinite(timeout)
                                                                                  and timeout > 0):
        raise ShoalError(f"{where}: cluster.timeout: must be > 0 seconds, got {timeout!r}")
    return float(timeout)


def job_file_table(run_dir: Path, name: str) -> dict:
    """One table of the run's job.toml as plain data ({} without the file or the table)."""
    path = run_dir / JOB_FILE
    if not path.is_file():
        return {}
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8")).get(name)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ShoalError(f"{path}: not a readable job file: {first_line(error)}") from error
    return table if isinstance(table, dict) else {}


def stopped_message(quiet_seconds: float, timeout: float) -> str:
    return (f"{STOPPED}: nothing recorded for {duration(quiet_seconds)}, longer than its cluster.timeout "
            f"({duration(timeout)}) allows")


def not_started(run_dir: Path, now: float, gone: bool = False) -> str:
    """What a run directory with its job.toml but no events yet says (`gone`: its lock is free)."""
    waited = max(now - (run_dir / JOB_FILE).stat().st_mtime, 0.0)
    if gone:
        return f"{run_dir}: no {EVENTS_FILE}, and its launcher is gone: the job never started"
    return (f"{run_dir}: no {EVENTS_FILE} {duration(waited)} after {JOB_FILE} was written: the job has not "
            "started (still loading its data, or its launcher was killed)")


def end_message(end: JobEnd, failures: list[WorkerFailed]) -> str | None:
    """The job's end message; where the launcher wrote its last failure's text (`exit code ?` where none was
    recorded), that failure told as its text() tells it."""
    if end.message and failures and end.message in (failures[-1].text(), failures[-1].text_before()):
        return failures[-1].text()
    return end.message


def worker_paces(last_epoch: EpochEnd | None) -> list[WorkerPace]:
    """Each worker's steps per second in the last epoch, and its rate and share when the record has them; the
    slowest marked (on a tie, the lowest rank)."""
    if last_epoch is None:
        return []
    recorded = last_epoch.balance is not None  # a record older than shares that follow speed has neither
    total = sum(worker.rows for worker in last_epoch.workers)
    workers = [WorkerPace(worker.rank, worker.host, worker.steps_per_second,
                          rate=worker_rate(worker) if recorded else None,
                          share=worker_share(worker, total) if recorded else None) for worker in last_epoch.workers]
    if len(workers) > 1:  # one worker is not "the slowest"
        # where shares differ, steps per second say nothing of speed: the rate of own work does
        pace = "rate" if all(worker.rate is not None for worker in workers) else "steps_per_second"
        min(workers, key=lambda worker: getattr(worker, pace)).slowest = True
    return workers


def worker_rate(worker: WorkerEpoch) -> float | None:
    """Its rows per second of its own work: as recorded, else its rows over its compute and data seconds;
    None when neither says (0.0 is what a record without the figure holds)."""
    if math.isfinite(worker.rate) and worker.rate > 0:
        return worker.rate
    busy = worker.compute + worker.data
    return worker.rows / busy if math.isfinite(busy) and busy > 0 and worker.rows > 0 else None


def worker_share(worker: WorkerEpoch, total_rows: int) -> float | None:
    """Its fraction of the epoch's rows: as recorded, else its rows over every worker's; None when unknown."""
    if math.isfinite(worker.share) and worker.share > 0:
        return worker.share
    return worker.rows / total_rows if total_rows > 0 else None


def machine_paces(workers: list[WorkerPace]) -> list[MachinePace]:
    """The workers by machine (host), in the order their first ranks come, with their rates and shares summed."""
    hosts: dict[str, list[WorkerPace]] = {}
    for worker in workers:
        hosts.setdefault(worker.host, []).append(worker)
    return [MachinePace(host, own, total([worker.rate for worker in own]), total([worker.share for worker in own]))
            for host, own in hosts.items()]


def total(values: list[float | None]) -> float | None:
    """The sum, or None when any part is unknown."""
    return None if any(value is None for value in values) else sum(values)


def summarize(run_dir: str | Path, now: float | None = None) -> Status:
    """Fold the run's events into its status (a folder without events is a user error)."""
    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    gone = held(run_dir) is False  # looked at before the events: a job that ends meanwhile has written its end
    if (run_dir / JOB_FILE).is_file() and not (run_dir / EVENTS_FILE).is_file():
        raise ShoalError(not_started(run_dir, now, gone))
    history = read_history(run_dir)
    timeline = Timeline()
    for event in history.events:
        timeline.add(event)
    last_time = history.last_time
    if last_time is None:
        last_time = (run_dir / EVENTS_FILE).stat().st_mtime
    start, end, progress, last_epoch = timeline.start, timeline.end, timeline.progress, timeline.last_epoch
    timeout = job_timeout(run_dir, start)
    state = run_state(end, now - last_time, timeout + STOP_GRACE_SECONDS)
    message = end_message(end, timeline.failures) if end is not None else None
    if end is None and gone:
        state, message = "stopped", LAUNCHER_GONE
    elif state == "stopped":
        message = stopped_message(now - last_time, timeout)
    epochs = start.configured_epochs() or (end.epochs if end is not None else None)
    epoch, step, steps_per_epoch, fraction = timeline.position()
    mean_epoch = timeline.mean_epoch(fraction)
    eta = None
    if state == "running" and epochs and mean_epoch is not None:  # a stalled job has no honest ETA
        eta = max((epochs - timeline.completed - fraction) * mean_epoch, 0.0)
    # wall time since job_start, resumes and restarts included (job_end's seconds count training only)
    elapsed = None if timeline.started_at is None else (now if state == "running" else last_time) - timeline.started_at
    world_size, hosts = timeline.machines()
    return Status(
        run_dir=str(run_dir), state=state, job=start.job, algorithm=start.algorithm, world_size=world_size,
        hosts=hosts, epoch=epoch, epochs=epochs, step=step,
        step_in_epoch=progress.step_in_epoch if progress else None, steps_per_epoch=steps_per_epoch,
        train_loss=last_epoch.train_loss if last_epoch else None, step_loss=progress.loss if progress else None,
        test=timeline.test, test_epoch=timeline.test_epoch,
        samples_per_second=last_epoch.samples_per_second if last_epoch else None, mean_epoch_seconds=mean_epoch,
        eta_seconds=eta, elapsed_seconds=elapsed, last_event_seconds_ago=max(now - last_time, 0.0),
        workers=worker_paces(last_epoch), restarts=len(timeline.restarts),
        last_restart=timeline.restarts[-1] if timeline.restarts else None, failures=len(timeline.failures),
        last_failure=timeline.failures[-1] if timeline.failures else None, checkpoints=len(timeline.checkpoints),
        last_checkpoint=timeline.checkpoints[-1] if timeline.checkpoints else None,
        message=message, silence_limit=timeout + STOP_GRACE_SECONDS,
        balance=last_epoch.balance if last_epoch else None, shares_moved=timeline.shares_moved(),
        membership=timeline.membership, started=any(isinstance(event, JobStart) for event in history.events),
        last_epoch=last_epoch)


def duration(seconds: float | None) -> str:
    """`42s`, `3m 05s`, `2h 07m`, `3d 04h`: as precise as a person watching a job needs."""
    if seconds is None:
        return "-"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def metrics_text(values: dict) -> str:
    return "  ".join(f"{key} {value:.4f}" for key, value in values.items())


def render(summary: Status) -> str:
    """A few plain lines for a terminal or a log."""
    lines = [f"{summary.run_dir}  {summary.state}"
             + (f"  (last record {duration(summary.last_event_seconds_ago)} ago)"
                if summary.state in ("stalled?", "stopped") else "")]
    if summary.message:
        lines.append(f"  {summary.message}")
    lines.append(job_line(summary))
    lines += membership_lines(summary.membership)
    if summary.started or summary.epoch or summary.step_in_epoch is not None:  # no "epoch 0" before the start
        lines.append(position_line(summary))
    lines += [line for line in (loss_line(summary), timing_line(summary)) if line]
    lines += worker_lines(summary)
    lines += shares_lines(summary.last_epoch)
    restarts = f"restarts {summary.restarts}"
    if summary.last_failure:
        restarts += f"  last failure: {summary.last_failure.text()}"
    lines.append(restarts)
    checkpoint = summary.last_checkpoint
    lines.append(f"checkpoints {summary.checkpoints}"
                 + (f"  latest: epoch {checkpoint.epoch} {checkpoint.path}" if checkpoint else ""))
    return "\n".join(lines)


def job_line(summary: Status) -> str:
    """`job demo  algorithm sync  world size 2  hosts a, b`: each detail the job_start holds."""
    if not summary.started:
        return NOT_STARTED
    details = (("job", summary.job), ("algorithm", summary.algorithm), ("world size", summary.world_size),
               ("hosts", ", ".join(summary.hosts) or None))
    return "  ".join(f"{name} {value}" for name, value in details if value is not None) or "job details not recorded"


def worker_label(worker: WorkerEpoch | WorkerPace, workers: list) -> str:
    """`host0`, or `host0 rank 1` on a machine with several workers, or `rank 1` where the host is unknown."""
    host = known_host(worker.host)
    if host is None:
        return f"rank {worker.rank}"
    several = sum(known_host(other.host) == host for other in workers) > 1
    return f"{host} rank {worker.rank}" if several else host


def shares_lines(record: EpochEnd | None) -> list[str]:
    """`shares   host0 50.0%, host1 25.0% (epoch 2); from epoch 3: host0 1,500, host1 750 rows`: each worker's
    share of the last epoch's rows, and the next epoch's rows where they moved; only for shares that differ
    by design (cluster.balance "speed" or fixed speeds)."""
    if not shares_differ(record):
        return []
    line = f"shares   {shares_text(record)} (epoch {record.epoch})"
    if record.next_shares:
        line += f"; from epoch {record.epoch + 1}: {next_rows_text(record)}"
    return [line]


def shares_differ(record: EpochEnd | None) -> bool:
    """Whether the record holds shares that differ by design: cluster.balance "speed" or fixed speeds."""
    return record is not None and record.balance not in (None, "equal") and bool(record.workers)


def shares_text(record: EpochEnd) -> str:
    """`host0 50.0%, host1 25.0%, host2 25.0%`: each worker's share of the epoch's rows."""
    total_rows = sum(worker.rows for worker in record.workers)
    shares = [worker_share(worker, total_rows) for worker in record.workers]
    return ", ".join(f"{worker_label(worker, record.workers)} "
                     + ("share not recorded" if share is None else f"{share:.1%}")
                     for worker, share in zip(record.workers, shares))


def next_rows_text(record: EpochEnd) -> str:
    """`host0 1,500, host1 750 rows`: each worker's rows in the next epoch; by position where the record's
    workers do not match its shares one for one (a change of machines)."""
    if len(record.next_shares) != len(record.workers):
        return " / ".join(f"{rows:,}" for rows in record.next_shares) + " rows per worker"
    return ", ".join(f"{worker_label(worker, record.workers)} {rows:,}"
                     for worker, rows in zip(record.workers, record.next_shares)) + " rows"


def worker_lines(summary: Status) -> list[str]:
    """A line per worker; with rates and shares recorded (and more than one worker, or shares that are not
    equal), a line per machine instead: its rows per second, its share of the rows, its workers' steps per
    second, and then how the rows were shared."""
    labels = ["workers  ", *(["         "] * (len(summary.workers) - 1))]
    if not summary.shows_machines():
        return [f"{label}rank {worker.rank}{host_text(worker.host)} {pace_text(worker)}"
                for label, worker in zip(labels, summary.workers)]
    machines = summary.machines
    width = max(len(machine.host) for machine in machines)
    lines = []
    for label, machine in zip(labels, machines):
        parts = [machine.host.ljust(width)]
        if machine.rate is not None:
            parts.append(f"{machine.rate:,.0f} rows/s")
        if machine.share is not None:
            parts.append(f"{machine.share:.1%} of the rows")
        parts.append(", ".join(f"rank {worker.rank} {worker.steps_per_second:,.1f} steps/s"
                               for worker in machine.workers))
        slowest = next((worker for worker in machine.workers if worker.slowest), None)
        if slowest is not None:
            parts[-1] += "  <- slowest" + (f": rank {slowest.rank}" if len(machine.workers) > 1 else "")
        lines.append(label + "  ".join(parts))
    return [*lines, f"balance  {balance_text(summary.balance, summary.shares_moved)}"]


def membership_lines(membership: list[Membership]) -> list[str]:
    """A line per change of machines (the first record holds those the job started on: no change); beyond
    MEMBERSHIP_LINES changes, the latest ones and a count of those before."""
    changes = membership[1:]
    shown = changes if len(changes) <= MEMBERSHIP_LINES else changes[1 - MEMBERSHIP_LINES:]
    texts = [machines_text(change) for change in shown]
    if len(shown) < len(changes):
        texts.insert(0, f"{len(changes) - len(shown)} earlier changes (shoal report lists each)")
    labels = ["machines ", *(["         "] * (len(texts) - 1))]
    return [label + text for label, text in zip(labels, texts)]


def machines_text(event: Membership) -> str:
    """`host0, host1 (2 workers) after epoch 2: host2 was lost (its launcher stopped answering)`: the machines
    of an attempt, the checkpoint's epoch it went on from and why its machines changed."""
    size = event.world_size or sum(event.workers)
    several = len(event.workers) > 1 and any(count != 1 for count in event.workers)
    counts = f": {' + '.join(map(str, event.workers))}" if several else ""  # each machine's, where they differ
    since = f"after epoch {event.from_epoch}" if event.from_epoch else "from the start"
    reason = f": {event.reason}" if event.reason else ""
    hosts = ", ".join(event.hosts) or "hosts not recorded"
    return f"{hosts} ({size} worker{'s' if size != 1 else ''}{counts}) {since}{reason}"


def host_text(host: str | None) -> str:
    """` (host-1)` after a rank; nothing where the record holds no host."""
    return f" ({known_host(host)})" if known_host(host) else ""


def pace_text(worker: WorkerPace) -> str:
    return f"{worker.steps_per_second:,.1f} steps/s" + ("  <- slowest" if worker.slowest else "")


def balance_text(balance: str, moved: list[int]) -> str:
    """`speed: shares moved after epochs 1, 3`: cluster.balance, and when speed shares moved."""
    if balance == "fixed":
        return "fixed (cluster.balance's relative speeds)"
    if balance != "speed":
        return balance
    if not moved:
        return "speed: shares not moved yet"
    if len(moved) > 4:
        return f"speed: shares moved {len(moved)} times, last after epoch {moved[-1]}"
    return f"speed: shares moved after epoch{'s' if len(moved) > 1 else ''} {', '.join(map(str, moved))}"


def position_line(summary: Status) -> str:
    """With a progress record the epoch shown is the one under way, else the last one finished; a count the
    records do not hold is left out."""
    under_way = summary.step_in_epoch is not None
    of = f"/{summary.epochs}" if summary.epochs else ""
    position = f"epoch {summary.epoch}{of} {'under way' if under_way else 'done'}  step {summary.step:,}"
    if under_way and summary.steps_per_epoch:
        position += f" ({summary.step_in_epoch:,}/{summary.steps_per_epoch:,} in this epoch)"
    elif under_way:
        position += f" ({summary.step_in_epoch:,} steps into this epoch)"
    return position


def loss_line(summary: Status) -> str:
    losses = []
    if summary.train_loss is not None:
        losses.append(f"train loss {summary.train_loss:.4f}")
    if summary.step_loss is not None:
        losses.append(f"current step loss {summary.step_loss:.4f}")
    if summary.test:
        losses.append(f"test (epoch {summary.test_epoch}) {metrics_text(summary.test)}")
    return "  ".join(losses)


def timing_line(summary: Status) -> str:
    timing = []
    if summary.samples_per_second is not None:
        timing.append(f"{summary.samples_per_second:,.0f} samples/s")
    if summary.elapsed_seconds is not None:  # None before job_start
        timing.append(f"elapsed {duration(summary.elapsed_seconds)}")
    if summary.eta_seconds is not None:
        timing.append(f"eta {duration(summary.eta_seconds)}")
    return "  ".join(timing)


class RunStopped(ShoalError):
    """`--watch` gave up: the run stopped without an end record, or its events never came."""

    exit_code = 1


def watch(run_dir: str | Path, interval: float = 2.0, stream=None, sleep=time.sleep, clock=time.time,
          start_seconds: float = START_SECONDS) -> Status:
    """Redraw the status every `interval` seconds until the job ends or Ctrl-C; the last summary.

    Raises RunStopped when the run stopped without an end record (drawn first), or when it has no
    events `start_seconds` after its job.toml was written or its launcher is gone: neither would ever
    end the watch.
    """
    if not interval > 0:
        raise ShoalError(f"--watch: must be a number of seconds > 0, got {interval}")
    stream = stream or sys.stdout
    terminal = stream.isatty()
    run_dir = Path(run_dir)
    wait_for_events(run_dir, interval, sleep, clock, start_seconds)
    summary = summarize(run_dir, clock())  # a bad folder fails here, before the loop
    first = True
    try:
        while True:
            if terminal:
                stream.write(CLEAR_SCREEN)
            elif not first:
                stream.write("\n")  # a log gets a blank line between refreshes, not escape codes
            first = False
            stream.write(render(summary) + "\n")
            stream.flush()
            if summary.state == "stopped":
                raise RunStopped(f"{run_dir}: {summary.message}")
            if summary.state not in ("running", "stalled?"):
                return summary
            sleep(interval)
            summary = summarize(run_dir, clock())
    except KeyboardInterrupt:
        return summary


def wait_for_events(run_dir: Path, interval: float, sleep, clock, start_seconds: float) -> None:
    """A job just started has its job.toml but no events until its workers are up: wait for them,
    up to `start_seconds` after job.toml was written, while its launcher holds the run directory."""
    while (run_dir / JOB_FILE).is_file():
        gone = held(run_dir) is False  # looked at first, as in summarize
        if (run_dir / EVENTS_FILE).is_file():
            return
        now = clock()
        if now - (run_dir / JOB_FILE).stat().st_mtime > start_seconds or gone:
            raise RunStopped(not_started(run_dir, now, gone))
        sleep(interval)
