"""Machines that leave and join a running job (`--nnodes MIN:MAX`) on the emulated cluster.

Three hosts, host0 alone on the first core, hosts 1-2 sharing the second (two cores here); each host's
/tmp is its own, so the run directory is not shared: host0 keeps the events and rank 0's checkpoints.
- `--nnodes 2:3`: every process of host2 is SIGKILLed in epoch 2; hosts 0-1 go on without it from the
  newest checkpoint, resharded onto 2 workers, and complete; the final model's accuracy is that of a
  2-worker job on the same data; the membership events tell who left and why.
- `--nnodes 1:2`: host0 starts alone; host1, whose /tmp holds no copy of the dataset, starts after epoch 1,
  joins at an epoch's end and trains its share streamed from host0 (bytes about its share's).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shoal.cluster import scratch
from shoal.events import read_events
from tests.cluster.hosts import EmulatedCluster, missing_requirements
from tests.cluster.jobs import PORT, wait_for_nodes
from tests.e2e.jobs import FEATURES, write_task

ROWS = 24_000  # a second's epoch on one worker: host1 takes seconds to start, epochs enough are left to join
LOST_ROWS = 6_000
EPOCHS = 4
JOIN_EPOCHS = 20
JOB_SECONDS = 120
SECRET = "elastic-test-secret"


@pytest.fixture(scope="module")
def three_hosts():
    reason = missing_requirements(2)  # two cores: hosts 1 and 2 share the second
    if reason:
        pytest.skip(reason)
    with EmulatedCluster(hosts=3, rate="1gbit", cores=[0, 1, 1]) as cluster:
        yield cluster


def write_job(folder: Path, name: str, algorithm: str = "sync", data: Path | None = None,
              seen: Path | None = None, epochs: int = EPOCHS, rows: int = ROWS) -> Path:
    """The job file in `folder`; its data written into `data` (default: `folder`) and named as the hosts see
    it, `seen` (default: where it was written)."""
    write_task((data or folder) / "task", rows=rows, test_rows=2000)
    train, test = ((seen or data or folder) / "task" / name for name in ("train", "test"))
    path = folder / f"{name}.toml"
    path.write_text(f"""
[model]
layers = [{{ dense = 64, activation = "tanh" }}, {{ dense = 2 }}]
[data]
train = "{train}"
test = "{test}"
[algorithm]
name = "{algorithm}"
[train]
epochs = {epochs}
batch_size = 16
optimizer = {{ name = "sgd", lr = 0.05 }}
[cluster]
threads = 1
timeout = 30
rejoin_timeout = 2
[output]
progress = "lines"
""")
    return path


def start_node(cluster, host: int, job: Path, nodes: str, run_dir: str, env: dict, log: Path):
    command = [sys.executable, "-m", "shoal", "train", str(job), "--workers", "1", "--nnodes", nodes,
               "--rdzv-endpoint", f"{cluster.address(0)}:{PORT}", "--rdzv-id", SECRET, "--run-dir", run_dir]
    return cluster.start(host, command, env=env, log=log)


def wait_for_epoch(run_dir: Path, epoch: int, seconds: float = 60) -> None:
    """Until the checkpoint of `epoch` (or a later one) is written."""
    deadline = time.monotonic() + seconds
    while not any(event["event"] == "checkpoint" and event["epoch"] >= epoch for event in read_events(run_dir)):
        assert time.monotonic() < deadline, f"epoch {epoch} did not end within {seconds} s"
        time.sleep(0.1)


def kill_host(cluster, host: int) -> None:
    for pid in cluster.pids(host):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def memberships(run_dir: Path) -> list[dict]:
    return [event for event in read_events(run_dir) if event["event"] == "membership"]


def final_accuracy(run_dir: Path) -> float:
    ends = [event for event in read_events(run_dir) if event["event"] == "job_end"]
    assert [end["status"] for end in ends] == ["completed"], ends
    return ends[0]["test"]["accuracy"]


def assert_nothing_left(cluster, hosts: range, seconds: float = 10) -> None:
    """No process on any host, and no scratch folder on `hosts` (a host killed outright keeps its launcher's
    until its next launch sweeps it)."""
    deadline = time.monotonic() + seconds
    while any(cluster.pids(host) for host in range(cluster.hosts)):
        assert time.monotonic() < deadline, {host: cluster.pids(host) for host in range(cluster.hosts)}
        time.sleep(0.1)
    for host in hosts:
        left = [path.name for path in cluster.private(host).iterdir()
                if path.name.startswith(("torchelastic_", *(f"{prefix}." for prefix in scratch.PREFIXES)))]
        assert not left, (host, left)


@pytest.mark.timeout(3 * JOB_SECONDS)
def test_a_lost_host_leaves_the_others_to_complete_the_job(three_hosts, project_env):
    cluster = three_hosts
    job = write_job(cluster.shared, "lose", rows=LOST_ROWS)
    run_dir = "/tmp/run-lose"  # each host's own
    logs = [cluster.shared / f"lose-host{host}.log" for host in range(3)]
    launchers = [start_node(cluster, host, job, "2:3", run_dir, project_env, logs[host]) for host in range(3)]
    events = cluster.private(0) / "run-lose"
    # the same data on 2 workers from the start (sync: the sums of a 2-host job), beside the cluster's run
    reference = cluster.shared / "run-two"
    alone = subprocess.Popen([sys.executable, "-m", "shoal", "train", str(job), "--workers", "2", "--run-dir",
                              str(reference)], env=project_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_epoch(events, 1)
        kill_host(cluster, 2)  # in epoch 2, epoch 1's checkpoint written: every process of host2, its launcher too
        wait_for_nodes(launchers[:2], logs[:2], JOB_SECONDS)
        assert_nothing_left(cluster, range(2))
        assert alone.wait(timeout=JOB_SECONDS) == 0, alone.stderr.read()
    finally:
        cluster.stop_processes()
        if alone.poll() is None:
            alone.kill()
            alone.wait()
        alone.stderr.close()
    changes = memberships(events)
    # nodes are numbered as they arrive: host0 holds the store and is node 0
    assert [sorted(change["hosts"]) for change in changes] == [["host0", "host1", "host2"], ["host0", "host1"]]
    lost = changes[1]
    assert lost["left"] == ["host2"] and "lost" in lost["reason"] and lost["world_size"] == 2
    assert lost["from_epoch"] >= 1 and sum(lost["shares"]) == LOST_ROWS and len(lost["shares"]) == 2
    ended = [event for event in read_events(events) if event["event"] == "epoch_end"]
    assert {event["epoch"] for event in ended} == set(range(1, EPOCHS + 1))
    assert [len(event["workers"]) for event in ended][-1] == 2
    assert abs(final_accuracy(events) - final_accuracy(reference)) <= 0.03


@pytest.mark.timeout(3 * JOB_SECONDS)
def test_a_host_without_the_data_joins_after_the_first_epoch_and_streams_its_share(three_hosts, project_env):
    cluster = three_hosts
    # host0's /tmp alone holds the dataset: host1 finds nothing at /tmp/data-join
    job = write_job(cluster.shared, "join", algorithm="averaging", data=cluster.private(0) / "data-join",
                    seen=Path("/tmp/data-join"), epochs=JOIN_EPOCHS)
    logs = [cluster.shared / f"join-host{host}.log" for host in range(2)]
    launchers = [start_node(cluster, 0, job, "1:2", "/tmp/run-join", project_env, logs[0])]
    events = cluster.private(0) / "run-join"
    try:
        wait_for_epoch(events, 1)
        assert not (cluster.private(1) / "data-join").exists()
        launchers.append(start_node(cluster, 1, job, "1:2", "/tmp/run-join", project_env, logs[1]))
        wait_for_nodes(launchers, logs, JOB_SECONDS)
        assert_nothing_left(cluster, range(2))
    finally:
        cluster.stop_processes()
    final_accuracy(events)
    changes = memberships(events)
    assert [change["hosts"] for change in changes] == [["host0"], ["host0", "host1"]], changes
    assert changes[1]["joined"] == ["host1"] and changes[1]["world_size"] == 2
    ended = [event for event in read_events(events) if event["event"] == "epoch_end"]
    assert len(ended[-1]["workers"]) == 2 and sum(worker["rows"] for worker in ended[-1]["workers"]) == ROWS
    loaded = [event for event in read_events(events) if event["event"] == "data_loaded"][-1]
    streamed = [holding for holding in loaded["shares"] if holding.get("streamed_bytes")]
    assert len(streamed) == 1, loaded  # host1's worker, from host0
    row_bytes = 4 * FEATURES + 8  # write_task's float32 features, and a label
    share = ROWS // 2
    assert share * row_bytes * 0.8 <= streamed[0]["streamed_bytes"] <= share * row_bytes * 1.5, streamed
