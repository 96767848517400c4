"""A machine taken out of a job of changing machines (`--nnodes 1:2`): the job goes on without it.

Two nodes on this machine stand for two machines, sharing one run folder (as on a shared filesystem: the
second is let in, though the first machine's run is there already). Once they have checkpointed an epoch together, the
second node's launcher gets SIGTERM (an operator taking the machine back): it says it leaves and stops its
worker, without ending the job; the first node goes on alone from the checkpoint, resharded onto
one worker, and completes. A fixed job stops everywhere on such a signal (tests/cluster).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from shoal.events import read_events
from tests.e2e.jobs import write_task

SECONDS = 60
JOB = """
[model]
layers = [{{ dense = 32, activation = "tanh" }}, {{ dense = 2 }}]
[data]
train = "{train}"
test = "{test}"
[algorithm]
name = "sync"
[train]
epochs = {epochs}
batch_size = 16
optimizer = {{ name = "sgd", lr = 0.05 }}
[cluster]
threads = 1
timeout = 30
rejoin_timeout = 1
[output]
progress = "none"
"""
"""A two-machine job of `epochs` on the task's rows (format with train, test and epochs)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def node(job, endpoint: str, run_dir, env, *rank: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shoal", "train", str(job), "--workers", "1", "--nnodes", "1:2",
                             *rank, "--rdzv-endpoint", endpoint, "--rdzv-id", "leave-test-6f1c9a2e", "--run-dir",
                             str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_until(test, seconds: float = SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not test():
        assert time.monotonic() < deadline, f"waited {seconds} s"
        time.sleep(0.1)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def together(run_dir) -> bool:
    """Whether both nodes trained an epoch together and checkpointed it."""
    if not (run_dir / "events.jsonl").exists():
        return False
    joined = False
    for event in read_events(run_dir):
        joined = joined or (event["event"] == "membership" and len(event["hosts"]) == 2)
        if joined and event["event"] == "checkpoint":
            return True
    return False


@pytest.mark.timeout(3 * SECONDS)
def test_a_machine_taken_out_leaves_and_the_job_goes_on_without_it(tmp_path, project_env):
    train, test = write_task(tmp_path / "task", rows=6000, test_rows=500)
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(train=train, test=test, epochs=30))  # room for the second to start and join
    port = free_port()
    endpoint, run_dir = f"127.0.0.1:{port}", tmp_path / "run"
    first = node(job, endpoint, run_dir, project_env, "--node-rank", "0")
    second = None
    try:
        wait_until(lambda: listening(port))  # the first node holds the job's store: it leads
        second = node(job, endpoint, run_dir, project_env)  # the folder shared, as on a shared filesystem
        wait_until(lambda: together(run_dir))
        second.send_signal(signal.SIGTERM)
        _, left = second.communicate(timeout=SECONDS)
        out, err = first.communicate(timeout=SECONDS)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert first.returncode == 0, err
    assert "leaves the job (SIGTERM); it goes on without this machine" in left, left
    assert "death signal" not in left  # shoal's line says why, torch's agent's is not added
    events = list(read_events(run_dir))
    assert [event["status"] for event in events if event["event"] == "job_end"] == ["completed"]
    changes = [event for event in events if event["event"] == "membership"]
    assert [(len(change["hosts"]), change["world_size"]) for change in changes][-2:] == [(2, 2), (1, 1)], changes
    assert "left (SIGTERM on its machine)" in changes[-1]["reason"], changes[-1]  # not "was lost"
    assert [len(event["workers"]) for event in events if event["event"] == "epoch_end"][-1] == 1
