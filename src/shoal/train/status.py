"""Where a job stands, from its events file alone: `shoal status RUN_DIR [--watch]`.

The coordinator may be on another machine or long gone, so nothing here talks to a process:
the summary is a fold over `events.jsonl`, and it works the same for a live, a finished and a
crashed run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from shoal.errors import ShoalError
from shoal.train.events import EVENTS_FILE, read_events

STALL_SECONDS = 600
"""A run without `job_end` whose last record is older than this shows as `stalled?`."""

CLEAR_SCREEN = "\033[H\033[2J"


def load_events(run_dir: str | Path) -> list[dict]:
    """All records of a run, oldest first; a folder without an events file is a user error."""
    if not (Path(run_dir) / EVENTS_FILE).is_file():
        raise ShoalError(f"{run_dir}: no {EVENTS_FILE}: not a shoal run directory")
    return list(read_events(run_dir))


def latest_epochs(events: list[dict]) -> list[dict]:
    """One `epoch_end` per epoch, the last one written: an epoch redone after a restart replaces
    the earlier attempt, whose weights the job threw away."""
    by_epoch: dict[int, dict] = {}
    for record in events:
        if record.get("event") == "epoch_end":
            by_epoch[record["epoch"]] = record
    return [by_epoch[epoch] for epoch in sorted(by_epoch)]


def summarize(run_dir: str | Path, now: float | None = None) -> dict:
    """The state of a run as plain data: progress, metrics, speed, ETA, workers, restarts."""
    events = load_events(run_dir)
    now = time.time() if now is None else now
    start: dict = {}  # the job's details: from job_start, or the latest job_resumed (which repeats them)
    started_at = None
    end: dict | None = None
    last_epoch: dict | None = None
    progress: dict | None = None
    test: dict = {}
    test_epoch = None
    completed = 0
    epoch_seconds: list[float] = []
    epoch_began = None  # when the epoch in progress started: the pace before any epoch has ended
    restarts: list[dict] = []
    failures: list[dict] = []
    checkpoints: list[dict] = []
    for record in events:
        kind = record.get("event")
        if kind == "job_start":
            start, end, epoch_began = record, None, record.get("time")
            started_at = record.get("time") if started_at is None else started_at
        elif kind == "data_loaded":
            epoch_began = record.get("time")
        elif kind == "progress":
            progress = record
        elif kind == "epoch_end":
            last_epoch, completed, epoch_began = record, record["epoch"], record.get("time")
            epoch_seconds.append(record["seconds"])
            if progress is not None and progress["epoch"] <= completed:
                progress = None
            if record.get("test"):
                test, test_epoch = record["test"], record["epoch"]
        elif kind == "checkpoint":
            checkpoints.append(record)
        elif kind == "worker_failed":
            failures.append(record)
        elif kind in ("job_restarted", "job_resumed"):
            # training goes on from the checkpoint's epoch; the epoch in progress was lost
            if kind == "job_restarted":
                restarts.append(record)
            elif "job" in record:
                start = record
            completed, progress, end, epoch_began = record["from_epoch"], None, None, record.get("time")
        elif kind == "job_end":
            end, progress = record, None
            if record.get("test"):
                test, test_epoch = record["test"], record.get("epochs", completed)

    last_time = events[-1]["time"] if events else (Path(run_dir) / EVENTS_FILE).stat().st_mtime
    if end is not None:
        state = end["status"]
    elif now - last_time > STALL_SECONDS:
        state = "stalled?"
    else:
        state = "running"

    config = start.get("config", {})
    epochs = config.get("train", {}).get("epochs") or (end or {}).get("epochs")
    steps_per_epoch = start.get("steps_per_epoch")
    fraction = 0.0
    if progress is not None:
        epoch, step = progress["epoch"], progress["step"]
        steps_per_epoch = progress.get("steps_per_epoch") or steps_per_epoch
        if steps_per_epoch:
            fraction = min(progress["step_in_epoch"] / steps_per_epoch, 1.0)
    else:
        epoch = completed
        step = last_epoch["step"] if last_epoch else 0
        if end is not None:
            step = end.get("steps", step)

    mean_epoch = sum(epoch_seconds) / len(epoch_seconds) if epoch_seconds else None
    if mean_epoch is None and fraction > 0 and epoch_began is not None:
        mean_epoch = (progress["time"] - epoch_began) / fraction  # first epoch: its pace so far
    eta = None
    if state == "running" and epochs and mean_epoch is not None:  # a stalled job has no honest ETA
        eta = max((epochs - completed - fraction) * mean_epoch, 0.0)

    # wall time since job_start, resumes and restarts included (job_end's seconds count training only)
    elapsed = None
    if started_at is not None:
        elapsed = (now if state == "running" else last_time) - started_at

    workers = []
    if last_epoch is not None:
        workers = [{"rank": worker["rank"], "host": worker.get("host", "?"),
                    "steps_per_second": worker["steps_per_second"], "slowest": False}
                   for worker in last_epoch["workers"]]
        if len(workers) > 1:  # one worker is not "the slowest"; on a tie the lowest rank is marked
            min(workers, key=lambda worker: worker["steps_per_second"])["slowest"] = True

    return {
        "run_dir": str(run_dir),
        "state": state,
        "job": start.get("job"),
        "algorithm": start.get("algorithm"),
        "world_size": start.get("world_size"),
        "hosts": sorted(set(start.get("hosts", []))),
        "epoch": epoch,
        "epochs": epochs,
        "step": step,
        "step_in_epoch": progress["step_in_epoch"] if progress else None,
        "steps_per_epoch": steps_per_epoch,
        "train_loss": last_epoch["train_loss"] if last_epoch else None,
        "step_loss": progress["loss"] if progress else None,
        "test": test,
        "test_epoch": test_epoch,
        "samples_per_second": last_epoch["samples_per_second"] if last_epoch else None,
        "mean_epoch_seconds": mean_epoch,
        "eta_seconds": eta,
        "elapsed_seconds": elapsed,
        "last_event_seconds_ago": max(now - last_time, 0.0),
        "workers": workers,
        "restarts": len(restarts),
        "last_restart": restarts[-1] if restarts else None,
        "failures": len(failures),
        "last_failure": failures[-1] if failures else None,
        "checkpoints": len(checkpoints),
        "last_checkpoint": checkpoints[-1] if checkpoints else None,
        "message": (end or {}).get("message"),
    }


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


def failure_text(failure: dict) -> str:
    """`rank 1 (host) exit code -9 (SIGKILL): message`."""
    signal = f" ({failure['signal']})" if failure.get("signal") else ""
    message = f": {failure['message']}" if failure.get("message") else ""
    return (f"rank {failure.get('rank', '?')} ({failure.get('host', '?')}) exit code {failure.get('exit_code', '?')}"
            f"{signal}{message}")


def render(summary: dict) -> str:
    """A few plain lines for a terminal or a log."""
    lines = [f"{summary['run_dir']}  {summary['state']}"
             + (f"  (last record {duration(summary['last_event_seconds_ago'])} ago)"
                if summary["state"] == "stalled?" else "")]
    if summary.get("message"):
        lines.append(f"  {summary['message']}")
    hosts = ", ".join(summary["hosts"])
    lines.append(f"job {summary['job'] or '?'}  algorithm {summary['algorithm'] or '?'}  "
                 f"world size {summary['world_size'] or '?'}" + (f"  hosts {hosts}" if hosts else ""))

    # with a progress record the epoch shown is the one under way, else the last one finished
    under_way = summary["step_in_epoch"] is not None
    position = (f"epoch {summary['epoch']}/{summary['epochs'] or '?'} {'under way' if under_way else 'done'}"
                f"  step {summary['step']:,}")
    if under_way:
        position += f" ({summary['step_in_epoch']:,}/{summary['steps_per_epoch'] or '?'} in this epoch)"
    lines.append(position)

    losses = []
    if summary["train_loss"] is not None:
        losses.append(f"train loss {summary['train_loss']:.4f}")
    if summary["step_loss"] is not None:
        losses.append(f"current step loss {summary['step_loss']:.4f}")
    if summary["test"]:
        losses.append(f"test (epoch {summary['test_epoch']}) {metrics_text(summary['test'])}")
    if losses:
        lines.append("  ".join(losses))

    timing = []
    if summary["samples_per_second"] is not None:
        timing.append(f"{summary['samples_per_second']:,.0f} samples/s")
    timing.append(f"elapsed {duration(summary['elapsed_seconds'])}")
    if summary["eta_seconds"] is not None:
        timing.append(f"eta {duration(summary['eta_seconds'])}")
    lines.append("  ".join(timing))

    for index, worker in enumerate(summary["workers"]):
        label = "workers  " if index == 0 else "         "
        line = f"{label}rank {worker['rank']} ({worker['host']}) {worker['steps_per_second']:,.1f} steps/s"
        lines.append(line + ("  <- slowest" if worker["slowest"] else ""))

    restarts = f"restarts {summary['restarts']}"
    if summary["last_failure"]:
        restarts += f"  last failure: {failure_text(summary['last_failure'])}"
    lines.append(restarts)
    checkpoint = summary["last_checkpoint"]
    lines.append(f"checkpoints {summary['checkpoints']}"
                 + (f"  latest: epoch {checkpoint['epoch']} {checkpoint['path']}" if checkpoint else ""))
    return "\n".join(lines)


def watch(run_dir: str | Path, interval: float = 2.0, stream=None, sleep=time.sleep) -> dict:
    """Redraw the status every `interval` seconds until the job ends or Ctrl-C; the last summary."""
    if not interval > 0:
        raise ShoalError(f"--watch: must be a number of seconds > 0, got {interval}")
    stream = stream or sys.stdout
    terminal = stream.isatty()
    run_dir = Path(run_dir)
    # a job just started has its job.toml but no events until its workers are up: wait for them
    while (run_dir / "job.toml").is_file() and not (run_dir / EVENTS_FILE).is_file():
        sleep(interval)
    summary = summarize(run_dir)  # a bad folder fails here, before the loop
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
            if summary["state"] not in ("running", "stalled?"):
                return summary
            sleep(interval)
            summary = summarize(run_dir)
    except KeyboardInterrupt:
        return summary
