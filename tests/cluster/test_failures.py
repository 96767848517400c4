"""Failures across two hosts of the emulated cluster: a killed worker restarts every node from the
checkpoint (with a shared run folder or each host's own), a cut link fails both launchers in time
naming the host, signals or a killed launcher leave nothing running on either host, and under
torchrun's own restarts the workers record the failure themselves."""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest
import torch

from shoal.events import read_events
from shoal.run.artifacts import load_model
from shoal.train.exits import WITHOUT_A_WORD
from tests.cluster.jobs import PORT, log_of, start_on_two_hosts, train_on_one_host, write_sabotaged_job

TIMEOUT = 10  # cluster.timeout of the jobs that wait on a lost host


@pytest.fixture(scope="module")
def reference(two_hosts, project_env_module, tmp_path_factory):
    """The weights of the sabotaged job's model trained without trouble, two workers on one machine."""
    job = write_sabotaged_job(two_hosts.shared, "reference")
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    train_on_one_host(job, run_dir, project_env_module)
    return load_model(run_dir, trust_code=True).state_dict()  # the test's own factory


def finish(cluster, launchers, run_dir, seconds: float = 150, logs=None) -> list[str]:
    """Wait for both launchers; their output."""
    deadline = time.monotonic() + seconds
    for launcher in launchers:
        launcher.wait(timeout=max(deadline - time.monotonic(), 1))
    return [log_of(cluster, run_dir, host, logs) for host in range(2)]


def wait_for_event(run_dir, kind: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not any(event["event"] == kind for event in read_events(run_dir)):
        assert time.monotonic() < deadline, f"no {kind} event within {seconds} s"
        time.sleep(0.2)


def assert_nothing_left(cluster, seconds: float) -> None:
    """Nothing runs on either host within `seconds` (a hang guard: they end within a second or two)."""
    deadline = time.monotonic() + seconds
    while any(cluster.pids(host) for host in range(2)):
        left = {host: cluster.pids(host) for host in range(2)}
        assert time.monotonic() < deadline, f"still running after {seconds} s: {left}"
        time.sleep(0.1)


def wait_until_nothing_runs_on(cluster, host: int) -> None:
    """Until `host` runs nothing: no limit of its own (the test's pytest timeout stops a hang), so no load can fail
    it while the processes are still on their way out."""
    while cluster.pids(host):
        time.sleep(0.1)


def assert_weights(run_dir, reference: dict) -> None:
    for name, tensor in load_model(run_dir, trust_code=True).state_dict().items():
        assert torch.equal(tensor, reference[name]), name


def assert_named_sigkill(run_dir) -> None:
    failed = [event for event in read_events(run_dir) if event["event"] == "worker_failed"]
    assert [(event["rank"], event["host"], event.get("signal")) for event in failed] == [(1, "host1", "SIGKILL")]
    assert [event["event"] for event in read_events(run_dir)].count("job_restarted") == 1


def test_a_worker_killed_on_host_1_restarts_both_hosts_from_the_checkpoint(two_hosts, project_env, reference):
    marker = two_hosts.shared / "killed-shared"
    job = write_sabotaged_job(two_hosts.shared, "kill-shared", action="kill", at=30, marker=marker)
    run_dir = two_hosts.shared / "run-kill-shared"
    launchers = start_on_two_hosts(two_hosts, job, run_dir, project_env, "--max-restarts", "1")
    logs = finish(two_hosts, launchers, run_dir)
    assert [launcher.returncode for launcher in launchers] == [0, 0], "\n".join(log[-2000:] for log in logs)
    assert marker.exists()  # it did fire, in epoch 2 (20 steps an epoch)
    assert_named_sigkill(run_dir)
    assert_weights(run_dir, reference)


def test_without_a_shared_folder_each_host_keeps_its_own_files(two_hosts, project_env, reference):
    marker = two_hosts.shared / "killed-private"
    job = write_sabotaged_job(two_hosts.shared, "kill-private", action="kill", at=30, marker=marker)
    run_dir = "/tmp/run-private"  # each host's own /tmp
    launchers = start_on_two_hosts(two_hosts, job, run_dir, project_env, "--max-restarts", "1")
    logs = finish(two_hosts, launchers, run_dir)
    assert [launcher.returncode for launcher in launchers] == [0, 0], "\n".join(log[-2000:] for log in logs)
    first, second = (two_hosts.private(host) / "run-private" for host in range(2))
    assert_named_sigkill(first)
    assert_weights(first, reference)
    assert not (second / "events.jsonl").exists() and not (second / "model.pt").exists()
    newest = sorted((second / "checkpoints").glob("epoch-*"))[-1]
    assert sorted(path.name for path in newest.iterdir()) == ["manifest.json", "rank-00001.pt"]
    assert sorted(path.name for path in (first / "checkpoints" / newest.name).iterdir()) == \
        ["coordinator.pt", "manifest.json", "rank-00000.pt"]


def test_a_cut_link_fails_both_launchers_in_time_naming_the_host(two_hosts, project_env):
    job = write_sabotaged_job(two_hosts.shared, "cut", delay=0.05, epochs=50, timeout=TIMEOUT)
    run_dir = two_hosts.shared / "run-cut"
    launchers = start_on_two_hosts(two_hosts, job, run_dir, project_env)
    try:
        wait_for_event(run_dir, "epoch_end")
        two_hosts.cut_link(1)
        # a hang guard, not a speed claim: both launchers must end, failed, within the job's timeout and 15 s
        logs = finish(two_hosts, launchers, run_dir, seconds=TIMEOUT + 15)
        assert all(launcher.returncode not in (0, None) for launcher in launchers)
        for log in logs:
            assert "host1" in log.strip().splitlines()[-1], log[-2000:]
        assert_nothing_left(two_hosts, seconds=5)
        end = [event for event in read_events(run_dir) if event["event"] == "job_end"]
        assert end and end[0]["status"] == "failed" and "host1" in end[0]["message"]
    finally:
        two_hosts.stop_processes()
        two_hosts.restore_link(1)


def test_sigterm_in_the_restart_rendezvous_stops_both_hosts(two_hosts, project_env):
    job = write_sabotaged_job(two_hosts.shared, "term", delay=0.05, epochs=50, timeout=30)
    run_dir = two_hosts.shared / "run-term"
    launchers = start_on_two_hosts(two_hosts, job, run_dir, project_env, "--max-restarts", "1")
    try:
        wait_for_event(run_dir, "epoch_end")
        launchers[1].send_signal(signal.SIGKILL)  # host 1's launcher: gone without a word
        wait_until_nothing_runs_on(two_hosts, 1)  # host 1's workers follow their launcher
        wait_for_event(run_dir, "job_restarted", seconds=30)  # host 0 now waits for host 1 to come back
        launchers[0].send_signal(signal.SIGTERM)
        assert_nothing_left(two_hosts, seconds=15)
        assert launchers[0].wait(timeout=1) == 143
        end = [event for event in read_events(run_dir) if event["event"] == "job_end"]
        assert [event["status"] for event in end] == ["interrupted"], json.dumps(end)
    finally:
        two_hosts.stop_processes()


def test_torchrun_on_two_hosts_restarts_a_killed_worker_and_records_it(two_hosts, project_env, reference):
    """The README's torchrun line on each host: c10d rendezvous, no --node-rank, no MASTER_* set by hand."""
    marker = two_hosts.shared / "killed-torchrun"
    job = write_sabotaged_job(two_hosts.shared, "kill-torchrun", action="kill", at=30, marker=marker)
    run_dir = two_hosts.shared / "run-torchrun"
    launchers = []
    for host in range(2):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{two_hosts.address(0)}:{PORT}", "--rdzv-id", "kill",
                   "--max-restarts", "1", "--log-dir", "/tmp/torchrun-logs",  # the host's own /tmp
                   "--local-addr", two_hosts.address(host), *(["--rdzv-conf", "is_host=1"] if host == 0 else []),
                   "-m", "shoal.worker", job, "--run-dir", str(run_dir)]
        launchers.append(two_hosts.start(host, command, env=project_env,
                                         log=two_hosts.shared / f"{run_dir.name}-host{host}.log"))
    logs = finish(two_hosts, launchers, run_dir)
    assert [launcher.returncode for launcher in launchers] == [0, 0], "\n".join(log[-2000:] for log in logs)
    assert marker.exists()
    failed = [event for event in read_events(run_dir) if event["event"] == "worker_failed"]
    assert [(event["rank"], event["message"]) for event in failed] == [(1, WITHOUT_A_WORD)], failed
    assert failed[0]["host"] in ("host0", "host1")
    kinds = [event["event"] for event in read_events(run_dir)]
    assert kinds.count("job_restarted") == 1 and kinds[-1] == "job_end"
    assert [event for event in read_events(run_dir) if event["event"] == "job_end"][-1]["status"] == "completed"
    assert_weights(run_dir, reference)
