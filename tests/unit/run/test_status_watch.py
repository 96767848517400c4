"""`shoal status --watch` never waits forever: a run that never wrote events, and a run whose
launcher was killed (no job_end, and its run directory's lock free, or where no lock says silent
for longer than its cluster.timeout), end the watch with a one-line message and exit status 1.

Run folders are written here with shoal's own event writer; time is a clock passed to `watch`
(its records carry the real time: the clock starts at the time of a file or a record).
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from shoal.cli import main
from shoal.errors import ShoalError
from shoal.events import DataLoaded, EventLog, JobEnd, JobStart, Progress, read_history
from shoal.run import status
from shoal.run.lock import hold_run_dir
from shoal.run.status import (
    LAUNCHER_GONE,
    STALL_SECONDS,
    STOP_GRACE_SECONDS,
    STOPPED,
    RunStopped,
    render,
    summarize,
    watch,
)
from tests.unit.run.test_directory import enter

TIMEOUT = 300.0


def job_file(run_dir: Path, text: str = "[cluster]\ntimeout = 300.0\n") -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "job.toml"
    path.write_text(text)
    return path


def started(run_dir: Path, timeout: float | None = TIMEOUT) -> float:
    """A run that started and made some progress, then went quiet; when its last record was written."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {"train": {"epochs": 3}} | ({"cluster": {"timeout": timeout}} if timeout is not None else {})
    log = EventLog(run_dir)
    try:
        log.write(JobStart(job="demo", config=config, world_size=2, algorithm="averaging", steps_per_epoch=10))
        log.write(DataLoaded(seconds=0.5, per_rank=[0.5, 0.4]))
        log.write(Progress(epoch=1, step=4, step_in_epoch=4, steps_per_epoch=10, loss=0.7))
    finally:
        log.close()
    return read_history(run_dir).last_time


class Clock:
    """Reads `start`, and later by as much as the watch has slept."""

    def __init__(self, start: float):
        self.now, self.naps = start, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.naps.append(seconds)
        self.now += seconds


# ---------------------------------------------------------------- no events


def test_watch_gives_up_on_a_job_file_without_events(tmp_path):
    run = tmp_path / "run"
    clock = Clock(job_file(run).stat().st_mtime)
    with pytest.raises(RunStopped) as raised:
        watch(run, 20.0, stream=io.StringIO(), sleep=clock.sleep, clock=clock, start_seconds=60.0)
    assert clock.naps == [20.0] * 4  # 0, 20, 40 and 60 s after job.toml: waiting; at 80 s: given up
    assert str(raised.value) == (f"{run}: no events.jsonl 1m 20s after job.toml was written: the job has not "
                                 "started (still loading its data, or its launcher was killed)")
    assert raised.value.exit_code == 1


def test_watch_gives_up_at_once_on_an_old_job_file(tmp_path):
    run = tmp_path / "run"
    written = job_file(run).stat().st_mtime
    os.utime(run / "job.toml", (written - 3600, written - 3600))  # the launch an hour ago never got going
    clock = Clock(written)
    with pytest.raises(RunStopped, match=r"no events.jsonl 1h 00m after job.toml was written: the job has not "):
        watch(run, 1.0, stream=io.StringIO(), sleep=clock.sleep, clock=clock)
    assert clock.naps == []


def test_watch_waits_for_events_that_come(tmp_path):
    run = tmp_path / "run"
    job_file(run)
    naps = []

    def sleep(seconds):  # the workers come up while the watcher waits, and the job ends at once
        naps.append(seconds)
        if len(naps) == 2:
            started(run)
            log = EventLog(run)
            log.write(JobEnd(status="completed", epochs=3, steps=30))
            log.close()

    summary = watch(run, 0.5, stream=io.StringIO(), sleep=sleep, start_seconds=60.0)
    assert naps == [0.5, 0.5] and summary.state == "completed"


def test_status_without_events_says_the_job_has_not_started(tmp_path, capsys):
    run = tmp_path / "run"
    job_file(run)
    assert main(["status", str(run)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"shoal: error: {run}: no events.jsonl ") and error.count("\n") == 1
    assert "after job.toml was written: the job has not started" in error


# ---------------------------------------------------------------- a killed launcher


def test_a_run_silent_beyond_its_timeout_stopped(tmp_path):
    run = tmp_path / "run"
    last = started(run)
    limit = TIMEOUT + STOP_GRACE_SECONDS
    assert summarize(run, now=last + 10).state == "running"
    assert summarize(run, now=last + STALL_SECONDS + 1).state == "stalled?"  # quiet, but within what it may be
    assert summarize(run, now=last + limit - 1).state == "stalled?"
    summary = summarize(run, now=last + limit + 1)
    assert summary.state == "stopped" and summary.eta_seconds is None and summary.silence_limit == limit
    assert summary.message == f"{STOPPED}: nothing recorded for 6m 01s, longer than its cluster.timeout (5m 00s) allows"
    text = render(summary)
    assert text.splitlines()[0] == f"{run}  stopped  (last record 6m 01s ago)"
    assert f"  {STOPPED}" in text


def test_the_limit_is_the_jobs_own_timeout(tmp_path):
    run = tmp_path / "run"
    last = started(run, timeout=30.0)
    assert summarize(run, now=last + 30 + STOP_GRACE_SECONDS - 1).state == "running"
    assert summarize(run, now=last + 30 + STOP_GRACE_SECONDS + 1).state == "stopped"


def test_an_ended_run_never_stopped(tmp_path):
    run = tmp_path / "run"
    started(run)
    log = EventLog(run)
    log.write(JobEnd(status="failed", message="worker 1 failed"))
    log.close()
    summary = summarize(run, now=time.time() + 10 * 86400)
    assert summary.state == "failed" and summary.message == "worker 1 failed"


def test_watch_of_a_killed_launcher_ends_with_the_reason(tmp_path):
    run = tmp_path / "run"
    clock = Clock(started(run))
    stream = io.StringIO()
    with pytest.raises(RunStopped) as raised:
        watch(run, 100.0, stream=stream, sleep=clock.sleep, clock=clock)
    assert clock.naps == [100.0] * 4  # 0 to 300 s quiet: running, then stalled?; at 400 s: stopped
    reason = f"{STOPPED}: nothing recorded for 6m 40s, longer than its cluster.timeout (5m 00s) allows"
    assert str(raised.value) == f"{run}: {reason}" and raised.value.exit_code == 1
    frames = stream.getvalue().split("\n\n")
    assert [frame.splitlines()[0] for frame in frames] == [
        f"{run}  running", f"{run}  running", f"{run}  stalled?  (last record 3m 20s ago)",
        f"{run}  stalled?  (last record 5m 00s ago)", f"{run}  stopped  (last record 6m 40s ago)"]
    assert frames[-1].splitlines()[1] == f"  {reason}"


def test_cli_watch_of_a_killed_launcher_exits_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(status, "STOP_GRACE_SECONDS", 0.0)  # the job's own timeout alone, in real time
    run = tmp_path / "run"
    started(run, timeout=0.05)
    assert main(["status", str(run), "--watch", "0.01"]) == 1
    captured = capsys.readouterr()
    assert "stopped" in captured.out
    assert captured.err.startswith(f"shoal: error: {run}: {STOPPED}: nothing recorded for ")
    assert captured.err.count("\n") == 1


# ---------------------------------------------------------------- a launcher gone: its lock is free


def test_a_run_whose_lock_is_free_stopped_at_once_and_one_held_runs(tmp_path):
    run = tmp_path / "run"
    last = started(run)
    with hold_run_dir(run):  # as its launcher holds it for the whole job
        assert summarize(run, now=last + 1).state == "running"
    summary = summarize(run, now=last + 1)  # however the launcher ended (SIGKILL, a full disk): no one holds it
    assert summary.state == "stopped" and summary.message == LAUNCHER_GONE and summary.eta_seconds is None
    assert render(summary).splitlines()[:2] == [f"{run}  stopped  (last record 1s ago)", f"  {LAUNCHER_GONE}"]
    log = EventLog(run)
    log.write(JobEnd(status="completed", epochs=3, steps=30))  # an end record says how it ended
    log.close()
    assert summarize(run).state == "completed"


def test_watch_of_a_run_whose_launcher_is_gone_ends_at_once(tmp_path):
    run = tmp_path / "run"
    clock = Clock(started(run))
    enter(run)  # a launcher held it, and is gone
    with pytest.raises(RunStopped) as raised:
        watch(run, 100.0, stream=io.StringIO(), sleep=clock.sleep, clock=clock)
    assert str(raised.value) == f"{run}: {LAUNCHER_GONE}" and clock.naps == []


def test_watch_of_a_job_file_whose_launcher_is_gone_ends_at_once(tmp_path):
    run = tmp_path / "run"
    clock = Clock(job_file(run).stat().st_mtime)
    enter(run)
    with pytest.raises(RunStopped) as raised:
        watch(run, 20.0, stream=io.StringIO(), sleep=clock.sleep, clock=clock, start_seconds=60.0)
    assert str(raised.value) == f"{run}: no events.jsonl, and its launcher is gone: the job never started"
    assert clock.naps == []


# ---------------------------------------------------------------- where the timeout comes from


def test_timeout_from_the_job_file_when_the_record_has_none(tmp_path):
    run = tmp_path / "run"
    last = started(run, timeout=None)
    job_file(run, "name = 'demo'\n[cluster]\ntimeout = 10\n")
    assert summarize(run, now=last + 10 + STOP_GRACE_SECONDS + 1).state == "stopped"
    (run / "job.toml").unlink()  # neither: shoal's default
    assert summarize(run, now=last + 10 + STOP_GRACE_SECONDS + 1).state == "running"
    assert summarize(run, now=last + TIMEOUT + STOP_GRACE_SECONDS + 1).state == "stopped"


@pytest.mark.parametrize("text, message", [
    ("[cluster]\ntimeout = -1\n", "job.toml: cluster.timeout: must be > 0 seconds, got -1"),
    ("[cluster]\ntimeout = 'soon'\n", "job.toml: cluster.timeout: must be > 0 seconds, got 'soon'"),
    ("[cluster\n", "job.toml: not a readable job file: "),
])
def test_a_bad_job_file_is_named(tmp_path, text, message):
    run = tmp_path / "run"
    started(run, timeout=None)
    job_file(run, text)
    with pytest.raises(ShoalError) as raised:
        summarize(run)
    assert str(raised.value).startswith(f"{run / message}") and "\n" not in str(raised.value)
