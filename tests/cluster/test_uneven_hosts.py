"""Machines that run different numbers of workers, on the emulated cluster: host0 runs 2 workers and host1 one,
started by hand (two `shoal train` nodes, `--workers 2` and `--workers 1`) or from one terminal
(`--hosts host0:2,host1:1`). Ranks stay contiguous per machine (0 and 1 on host0, 2 on host1), `sync` ends with
the weights of the same job on 3 local workers (also when stopped after an epoch and resumed on the same
machines), `averaging` (grouped by machine) and `downpour` complete.

The weights are compared with torch.allclose(atol=1e-6, rtol=0): the 3 ranks average the same gradients, but
gloo may sum them in another order across machines than on one, which moves the last bits of a float32.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shoal.events import read_events
from shoal.run.artifacts import load_model
from tests.cluster.jobs import JOB_SECONDS, PORT, wait_for_nodes, write_job

LAYOUT = {0: "host0", 1: "host0", 2: "host1"}  # rank: the machine it ran on
TOLERANCE = 1e-6


def by_hand(cluster, job: str, run_dir: Path, env: dict, *options: str, resume: bool = False) -> None:
    """Two nodes started by hand, as the README's Many machines section says: host0 with 2 workers, host1 with 1
    (`resume`: each goes on with the run in `run_dir`)."""
    launchers, logs = [], []
    for host, workers in ((0, 2), (1, 1)):
        start = ["--resume", str(run_dir)] if resume else [job, "--run-dir", str(run_dir)]
        command = [sys.executable, "-m", "shoal", "train", *start, "--workers", str(workers), "--nnodes", "2",
                   "--node-rank", str(host), "--rdzv-endpoint", f"{cluster.address(0)}:{PORT}", "--rdzv-id",
                   "uneven-hosts-4b7e0d19", *options]
        logs.append(cluster.shared / f"{run_dir.name}-host{host}{'-resumed' if resume else ''}.log")
        launchers.append(cluster.start(host, command, log=logs[-1], env=env))
    wait_for_nodes(launchers, logs)


def from_one_terminal(cluster, job: str, run_dir: Path, env: dict, hosts: str = "host0:2,host1:1") -> str:
    """`shoal train --hosts` from outside every host, reaching each through the cluster's stand-in for ssh."""
    remote = f"{cluster.enter} {{host}}"
    finished = subprocess.run([sys.executable, "-m", "shoal", "train", job, "--hosts", hosts, "--run-dir",
                               str(run_dir), "--set", f"cluster.remote='{remote}'"], capture_output=True, text=True,
                              env=env, timeout=JOB_SECONDS)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    return finished.stdout


def on_one_machine(job: str, run_dir: Path, env: dict, workers: int = 3) -> None:
    finished = subprocess.run([sys.executable, "-m", "shoal", "train", job, "--workers", str(workers), "--run-dir",
                               str(run_dir)], capture_output=True, text=True, env=env, timeout=JOB_SECONDS)
    assert finished.returncode == 0, finished.stderr[-3000:]


def placed(run_dir: Path) -> tuple[int, dict[int, str]]:
    """(the job's world size, each training rank's host) as the run's events recorded them."""
    events = list(read_events(run_dir))
    start = next(event for event in events if event["event"] == "job_start")
    last = [event for event in events if event["event"] == "epoch_end"][-1]
    assert [event["status"] for event in events if event["event"] == "job_end"][-1:] == ["completed"]
    return start["world_size"], {worker["rank"]: worker["host"] for worker in last["workers"]}


def assert_same_weights(run_dir: Path, reference: Path) -> None:
    mine, theirs = load_model(run_dir).state_dict(), load_model(reference).state_dict()
    assert mine.keys() == theirs.keys()
    for name, tensor in mine.items():
        difference = (tensor - theirs[name]).abs().max().item()
        assert torch.allclose(tensor, theirs[name], atol=TOLERANCE, rtol=0), f"{name}: differs by {difference:g}"


@pytest.fixture(scope="module")
def local_sync(two_hosts, tmp_path_factory, project_env_module):
    """The sync job on 3 local workers of this machine: the weights 2 + 1 workers on two hosts must end with."""
    job = write_job(two_hosts.shared, "sync")
    run_dir = tmp_path_factory.mktemp("local") / "run"
    on_one_machine(job, run_dir, project_env_module)
    assert placed(run_dir)[0] == 3
    return job, run_dir


@pytest.mark.timeout(2 * JOB_SECONDS + 60)
def test_nodes_started_by_hand_with_2_and_1_workers_train_sync_to_the_weights_of_3_local_workers(
        two_hosts, local_sync, project_env):
    job, reference = local_sync
    run_dir = two_hosts.shared / "run-sync-by-hand"
    by_hand(two_hosts, job, run_dir, project_env)
    assert placed(run_dir) == (3, LAYOUT)
    assert_same_weights(run_dir, reference)


@pytest.mark.timeout(2 * JOB_SECONDS + 60)
def test_hosts_with_2_and_1_workers_from_one_terminal_train_sync_to_the_weights_of_3_local_workers(
        two_hosts, local_sync, project_env):
    job, reference = local_sync
    run_dir = two_hosts.shared / "run-sync-hosts"
    output = from_one_terminal(two_hosts, job, run_dir, project_env)
    assert "[host0]" in output and "[host1]" in output
    assert placed(run_dir) == (3, LAYOUT)
    assert_same_weights(run_dir, reference)


@pytest.mark.timeout(3 * JOB_SECONDS + 60)
def test_a_run_of_2_and_1_workers_resumes_on_2_and_1_to_the_weights_of_3_local_workers(two_hosts, local_sync,
                                                                                        project_env):
    """Its checkpoints were written by 3 workers in all: what each machine's count sums to, not either one's
    count times the machines."""
    job, reference = local_sync
    run_dir = two_hosts.shared / "run-sync-resumed"
    by_hand(two_hosts, job, run_dir, project_env, "--set", "train.epochs=1")
    by_hand(two_hosts, job, run_dir, project_env, "--set", "train.epochs=2", resume=True)
    assert [event["from_epoch"] for event in read_events(run_dir) if event["event"] == "job_resumed"] == [1]
    assert placed(run_dir) == (3, LAYOUT)
    assert_same_weights(run_dir, reference)


@pytest.mark.timeout(2 * JOB_SECONDS + 60)
def test_downpour_completes_on_2_and_1_workers(two_hosts, project_env):
    job = write_job(two_hosts.shared, "downpour")
    run_dir = two_hosts.shared / "run-downpour-uneven"
    from_one_terminal(two_hosts, job, run_dir, project_env)
    # Downpour's rank 0 serves (on host0) and trains nothing: its trainers are ranks 1 and 2
    assert placed(run_dir) == (3, {1: "host0", 2: "host1"})
    assert (run_dir / "model.pt").is_file()


@pytest.mark.timeout(2 * JOB_SECONDS + 60)
def test_averaging_grouped_by_machine_completes_with_the_groups_of_each_machines_workers(two_hosts, project_env,
                                                                                        tmp_path):
    """Averaging on 2 + 1 workers started by hand completes; with cluster.groups = "machine" its groups are
    [0, 1] and [2]: the weights of the same job with the two contiguous groups of cluster.groups = 2 on 3 local
    workers."""
    job = write_job(two_hosts.shared, "averaging")
    rounds = ["--set", "algorithm.period=4", "--set", "algorithm.group_period=2"]
    run_dir = two_hosts.shared / "run-averaging-by-machine"
    by_hand(two_hosts, job, run_dir, project_env, "--set", 'cluster.groups="machine"', *rounds)
    assert placed(run_dir) == (3, LAYOUT)
    reference = tmp_path / "local"
    finished = subprocess.run([sys.executable, "-m", "shoal", "train", job, "--workers", "3", "--run-dir",
                               str(reference), "--set", "cluster.groups=2", *rounds], capture_output=True, text=True,
                              env=project_env, timeout=JOB_SECONDS)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_same_weights(run_dir, reference)
