"""Jobs for the emulated cluster, and `shoal train` started on its hosts the README's way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed.common import write_dataset
from tests.e2e.jobs import write_task

PORT = 29400
SECRET = "0c4f9a2b7d1e8c3a5f6b0d9e2a7c4b81"
"""The job's secret every host is given, in its environment (SHOAL_JOB_SECRET), as the README says."""
JOB_SECONDS = 120


def write_job(folder: Path, algorithm: str, train: Path | None = None, test: Path | None = None) -> str:
    """A small job any algorithm trains in seconds, on rows written into `folder` unless `train` (and `test`) name
    where the hosts find them."""
    if train is None:
        train = folder / "train"
        if not train.exists():
            write_dataset(train, rows=600, seed=1)
    test_line = f'test = "{test}"\n' if test is not None else ""
    path = folder / f"{algorithm}.toml"
    path.write_text(f"""
[model]
input = [6]
layers = [{{ dense = 16, activation = "tanh" }}, {{ dense = 3 }}]
[data]
train = "{train}"
{test_line}[algorithm]
name = "{algorithm}"
[train]
epochs = 2
batch_size = 32
optimizer = {{ name = "sgd", lr = 0.1 }}
[cluster]
threads = 1
timeout = 60
[output]
progress = "none"
""")
    return str(path)


def write_sabotaged_job(folder: Path, name: str, *, action: str = "none", at: int = 0, marker: Path | None = None,
                        delay: float = 0.0, epochs: int = 3, timeout: float = 60) -> str:
    """A job whose model misbehaves on rank 1 on cue (tests.support.models:sabotaged), a checkpoint per epoch."""
    if not (folder / "task").exists():
        write_task(folder / "task", rows=2000, test_rows=200)
    path = folder / f"{name}.toml"
    path.write_text(f"""
[model]
factory = "tests.support.models:sabotaged"
arguments = {{ action = "{action}", at = {at}, marker = "{marker or ''}", delay = {delay} }}
[data]
train = "{folder / 'task' / 'train'}"
test = "{folder / 'task' / 'test'}"
[algorithm]
name = "averaging"
[train]
epochs = {epochs}
batch_size = 50
optimizer = {{ name = "adam", lr = 0.003 }}
[cluster]
threads = 1
timeout = {timeout}
[output]
progress = "lines"
""")
    return str(path)


def start_on_two_hosts(cluster, job: str, run_dir, env, *options: str, node_ranks: bool = True,
                       logs: Path | None = None, workers: int = 1) -> list[subprocess.Popen]:
    """`shoal train` on each of two hosts, `workers` there, as the README's Many machines section says; output in
    host-N.log."""
    return start_on_every_host(cluster, job, run_dir, env, *options, nodes=2, node_ranks=node_ranks, logs=logs,
                               workers=workers)


def start_on_every_host(cluster, job: str, run_dir, env, *options: str, nodes: int | None = None,
                        node_ranks: bool = True, logs: Path | None = None, workers: int = 1) -> list[subprocess.Popen]:
    """`shoal train` on the first `nodes` hosts (default: all of them), `workers` on each; output in host-N.log."""
    launchers = []
    nodes = cluster.hosts if nodes is None else nodes
    for host in range(nodes):
        ranks = ["--node-rank", str(host)] if node_ranks else []
        command = [sys.executable, "-m", "shoal", "train", job, "--workers", str(workers), "--nnodes", str(nodes),
                   *ranks, "--rdzv-endpoint", f"{cluster.address(0)}:{PORT}", "--run-dir", str(run_dir), *options]
        log = (logs or cluster.shared) / f"{Path(run_dir).name}-host{host}.log"
        launchers.append(cluster.start(host, command, env={**env, "SHOAL_JOB_SECRET": SECRET}, log=log))
    return launchers


def start_on_hosts(cluster, job: str, run_dir, env, hosts: int) -> list[subprocess.Popen]:
    """`shoal train` with one worker on host 0 alone (`hosts` 1) or on both hosts; output in RUN-host-N.log."""
    if hosts == 2:
        return start_on_two_hosts(cluster, job, run_dir, env)
    command = [sys.executable, "-m", "shoal", "train", job, "--workers", "1", "--run-dir", str(run_dir)]
    return [cluster.start(0, command, env=env, log=cluster.shared / f"{Path(run_dir).name}-host0.log")]


def log_of(cluster, run_dir, host: int, logs: Path | None = None) -> str:
    return ((logs or cluster.shared) / f"{Path(run_dir).name}-host{host}.log").read_text()


def train_on_two_hosts(cluster, job: str, run_dir, env, *options: str, node_ranks: bool = True) -> None:
    """Both hosts' launchers must succeed, without torch's store warnings in their output."""
    launchers = start_on_two_hosts(cluster, job, run_dir, env, *options, node_ranks=node_ranks)
    deadline = time.monotonic() + JOB_SECONDS
    for host, launcher in enumerate(launchers):
        launcher.wait(timeout=max(deadline - time.monotonic(), 1))
        log = log_of(cluster, run_dir, host)
        assert launcher.returncode == 0, f"host {host}:\n{log[-3000:]}"
        assert "socket.cpp" not in log, "torch's store warnings reached the terminal"


def wait_for_nodes(launchers: list[subprocess.Popen], logs: list[Path], seconds: float = JOB_SECONDS) -> None:
    """Every node's launcher must end, within `seconds` in all, and succeed; a failure shows its log's end."""
    deadline = time.monotonic() + seconds
    for launcher, log in zip(launchers, logs):
        try:
            launcher.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            pytest.fail(f"{log.name} still runs after {seconds:g} s:\n{log.read_text()[-3000:]}")
        assert launcher.returncode == 0, log.read_text()[-3000:]


class OneHostRun:
    """`shoal train` of `job` by `workers` (2) on this machine, outside every host (as `train_on_one_host`), started at
    once and waited for when its run is asked for: it trains beside a test's run on the hosts (whose cores wait on
    the network and on launches much of the time) instead of after it. Leaving the `with` block ends whatever of it
    still runs."""

    def __init__(self, job: str, run_dir, env, workers: int = 2, seconds: float = JOB_SECONDS):
        self.run_dir = Path(run_dir)
        self.log = Path(f"{run_dir}.log")
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        with open(self.log, "w") as output:
            self.process = subprocess.Popen([sys.executable, "-m", "shoal", "train", job, "--workers", str(workers),
                                             "--run-dir", str(run_dir)], env=env, stdout=output,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self) -> Path:
        """The run directory, once the job ended well."""
        try:
            self.process.wait(timeout=max(self.deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run on one host still runs after {self.seconds:g} s:\n{self.log.read_text()[-3000:]}")
        assert self.process.returncode == 0, self.log.read_text()[-3000:]
        return self.run_dir

    def __enter__(self) -> OneHostRun:
        return self

    def __exit__(self, *exception) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # its workers too: they share its session
        self.process.wait()


def train_on_one_host(job: str, run_dir, env) -> None:
    """`job` by 2 workers on this machine, to its end (`OneHostRun`, waited for at once)."""
    with OneHostRun(job, run_dir, env) as run:
        run.wait()
