"""A job whose launcher is gone without writing its end: killed outright, or stopped by a full disk at its events.
`shoal status` says it stopped (its run directory's lock is free), a full disk is one line from each process,
and events.jsonl holds whole records only."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from shoal.run.status import LAUNCHER_GONE
from tests.unit.test_trust import write_dataset

TIMEOUT = 120
DISK_BYTES = 16 * 1024
"""The small disk's size: job.toml, the lock and some 10 epochs of records (4 KiB pages each)."""


def write_endless_job(folder: Path) -> Path:
    """A job of one worker whose epochs (a few steps each) outlast any test: only its events grow."""
    train = write_dataset(folder / "train")
    job = folder / "job.toml"
    job.write_text(f'[model]\nlayers = [{{ dense = 2 }}]\n[data]\ntrain = "{train}"\n[train]\nepochs = 100000\n'
                   'batch_size = 8\n[output]\nprogress = "none"\n[checkpoint]\nevery = 0\n')
    return job


def shoal_command(*arguments, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, arguments)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=TIMEOUT)


def whole_records(path: Path) -> list[dict]:
    """Every line of an events file, parsed: a torn record fails here."""
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A tmpfs of DISK_BYTES mounted in the test's folder (unmounted after), or a skip with the reason."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(disk)],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], capture_output=True, timeout=30, check=True)


def test_a_full_disk_at_the_events_is_one_line_per_process_and_no_torn_record(tmp_path, small_disk, project_env):
    job = write_endless_job(tmp_path)
    run_dir = Path("disk/run")  # as the user gave it: the messages name it so
    finished = shoal_command("train", job, "--workers", 1, "--run-dir", run_dir, cwd=tmp_path, env=project_env)
    assert finished.returncode == 2, finished.stderr
    assert "Traceback" not in finished.stderr
    lines = finished.stderr.splitlines()
    full = f"{run_dir / 'events.jsonl'}: no room for the run's next record ("
    assert [line.split(": ", 1)[0] for line in lines] == ["shoal worker 0", "shoal"]  # the worker, the launcher
    assert all(line.split(": ", 2)[2].startswith(full) for line in lines), lines
    records = whole_records(small_disk / "run" / "events.jsonl")
    assert records[0]["event"] == "job_start"
    status = shoal_command("status", run_dir, cwd=tmp_path, env=project_env).stdout.splitlines()
    if any(record["event"] == "job_end" for record in records):  # a shorter end record fitted where one did not
        assert status[0] == f"{run_dir}  failed" and status[1].startswith(f"  {full}"), status
    else:  # none fitted: its launcher ended without one
        assert status[0].startswith(f"{run_dir}  stopped  (last record ") and status[1] == f"  {LAUNCHER_GONE}"


def test_status_of_a_job_whose_launcher_was_killed_says_it_stopped(tmp_path, project_env):
    job, run_dir = write_endless_job(tmp_path), tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-m", "shoal", "train", str(job), "--workers", "1", "--run-dir",
                                 str(run_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=project_env, start_new_session=True)
    children: list[psutil.Process] = []
    try:
        wait_for_an_epoch(run_dir / "events.jsonl", launcher)
        children = psutil.Process(launcher.pid).children(recursive=True)
        running = shoal_command("status", run_dir, cwd=tmp_path, env=project_env)
        assert running.stdout.startswith(f"{run_dir}  running\n"), running.stdout
        launcher.send_signal(signal.SIGKILL)  # no end record: nothing is left to write it
        launcher.wait(timeout=30)
        status = shoal_command("status", run_dir, cwd=tmp_path, env=project_env)
        assert status.returncode == 0
        assert status.stdout.startswith(f"{run_dir}  stopped  (last record "), status.stdout
        assert status.stdout.splitlines()[1] == f"  {LAUNCHER_GONE}"
        assert not any(record["event"] == "job_end" for record in whole_records(run_dir / "events.jsonl"))
        watched = shoal_command("status", run_dir, "--watch", "1", cwd=tmp_path, env=project_env)
        assert watched.returncode == 1 and watched.stderr == f"shoal: error: {run_dir}: {LAUNCHER_GONE}\n"
    finally:
        launcher.kill()
        launcher.wait(timeout=30)
        for child in children:  # the workers end with their launcher; any left is ended here
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(children, timeout=30)


def wait_for_an_epoch(events: Path, launcher: subprocess.Popen) -> None:
    """Until the job has trained an epoch (it is well under way), or fail after TIMEOUT seconds."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        assert launcher.poll() is None, "the job ended before it was killed"
        if events.is_file() and '"epoch_end"' in events.read_text():
            return
        time.sleep(0.1)
    pytest.fail(f"no epoch trained in {TIMEOUT} s")
