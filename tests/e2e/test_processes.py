"""What a job leaves behind in the processes and folders around it: the caller's signal handlers
back after `shoal.fit`, no launcher folders in the temporary directory (nor after a launcher killed
outright), SIGHUP ignored under nohup, and nothing listening beyond loopback."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

import shoal
from shoal.cluster import scratch
from shoal.events import read_events
from tests.e2e.jobs import write_job, write_task

TIMEOUT = 240
LAUNCHER_FOLDERS = ("torchelastic_*", "shoal-launch.*")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("task"), rows=2000, test_rows=200)


def launcher_folders() -> set[Path]:
    temporary = Path(tempfile.gettempdir())
    return {path for pattern in LAUNCHER_FOLDERS for path in temporary.glob(pattern)}


def wait_for_first_epoch(launcher: subprocess.Popen, run_dir: Path) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not any(record["event"] == "epoch_end" for record in read_events(run_dir)):
        assert launcher.poll() is None and time.monotonic() < deadline, "the job ended before epoch 1"
        time.sleep(0.05)


def test_fit_gives_the_callers_signal_handlers_and_environment_back_and_leaves_no_folders(task, tmp_path,
                                                                                          monkeypatch):
    def mine(signum, frame):
        raise AssertionError("not expected to run")

    # a temporary directory of the test's own: other tests' jobs, running beside this one, make their folders in /tmp
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again

    before = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)}
    folders = launcher_folders()
    environment = dict(os.environ)
    signal.signal(signal.SIGTERM, mine)
    try:
        shoal.fit(write_job(tmp_path / "job.toml", *task, epochs=1), workers=2, run_dir=tmp_path / "run")
        # a torchrun started later by the caller would take its workers for shoal's own (torch's
        # dynamo sets its cache folder when first imported, which is torch's own doing)
        torchs = "TORCHINDUCTOR_CACHE_DIR"
        assert {k: v for k, v in os.environ.items() if k != torchs} == {k: v for k, v in environment.items()
                                                                         if k != torchs}
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
        assert signal.getsignal(signal.SIGQUIT) is before[signal.SIGQUIT]
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    assert launcher_folders() <= folders, "the job left a launcher folder in the temporary directory"


def test_sighup_is_ignored_under_nohup(task, tmp_path, project_env):
    job = write_job(tmp_path / "job.toml", *task, epochs=3)
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen(  # as `nohup shoal train ...` starts it: SIGHUP ignored
        [sys.executable, "-m", "shoal", "train", str(job), "--workers", "2", "--run-dir", str(run_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=project_env,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        wait_for_first_epoch(launcher, run_dir)
        os.kill(launcher.pid, signal.SIGHUP)  # the terminal closes
        _, stderr = launcher.communicate(timeout=TIMEOUT)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, stderr
    assert (run_dir / "model.pt").is_file()


def test_a_job_on_one_machine_listens_on_loopback_only(task, tmp_path, project_env):
    """torch's store is unauthenticated (and unpickles what it is sent): nothing of it may face the network."""
    job = write_job(tmp_path / "job.toml", *task, epochs=20)
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "shoal", "train", str(job), "--workers", "2", "--run-dir", str(run_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=project_env)
    try:
        wait_for_first_epoch(launcher, run_dir)
        job_processes = [psutil.Process(launcher.pid), *psutil.Process(launcher.pid).children(recursive=True)]
        listening = [connection.laddr for process in job_processes
                     for connection in process.net_connections(kind="inet") if connection.status == psutil.CONN_LISTEN]
    finally:
        launcher.terminate()  # a clean stop: a SIGKILLed launcher could not remove its folder
        launcher.communicate(timeout=30)
    assert len(listening) >= 3  # the job's store, the workers' store, gloo's listeners
    assert all(ipaddress.ip_address(address.ip).is_loopback for address in listening), listening


@pytest.mark.timeout(2 * TIMEOUT)
def test_a_launcher_killed_outright_leaves_no_folder_in_the_temporary_directory(task, tmp_path, project_env):
    job = write_job(tmp_path / "job.toml", *task, epochs=20)
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "shoal", "train", str(job), "--workers", "2", "--run-dir", str(run_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=project_env)
    try:
        wait_for_first_epoch(launcher, run_dir)
        temporary = Path(tempfile.gettempdir())
        owned = [path for path in temporary.glob("shoal-*") if scratch.owner(path.name) == launcher.pid]
        assert len(owned) == 2, owned  # its launch's worker logs and its fork server's socket
        job_processes = psutil.Process(launcher.pid).children(recursive=True)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        _, alive = psutil.wait_procs(job_processes, timeout=30)  # workers stop as orphans, the server ends
        assert not alive, [process.cmdline() for process in alive]
    finally:
        launcher.kill()
        launcher.wait()
    assert not [path for path in owned if path.exists()], "a killed launcher's folders remain"
