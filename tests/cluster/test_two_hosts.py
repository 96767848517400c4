"""Two hosts on the emulated cluster, started the README's way with no GLOO/NCCL variables set,
whose hostnames resolve to loopback: every algorithm trains, and sync and averaging end with
exactly the weights of the same job (same world size) on one host."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from shoal.train.artifacts import load_model
from tests.distributed.common import write_dataset

PORT = 29400
JOB_SECONDS = 120


def write_job(folder, algorithm: str) -> str:
    train = folder / "train"
    if not train.exists():
        write_dataset(train, rows=600, seed=1)
    path = folder / f"{algorithm}.toml"
    path.write_text(f"""
[model]
input = [6]
layers = [{{ dense = 16, activation = "tanh" }}, {{ dense = 3 }}]
[data]
train = "{train}"
[algorithm]
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


def train_on_two_hosts(cluster, job: str, run_dir, env, *options: str) -> None:
    """`shoal train` on each host, as the README's Many machines section says; both must succeed."""
    launchers = []
    for host in range(2):
        command = [sys.executable, "-m", "shoal", "train", job, "--workers", "1", "--nnodes", "2",
                   "--node-rank", str(host), "--rdzv-endpoint", f"{cluster.address(0)}:{PORT}",
                   "--run-dir", str(run_dir), *options]
        launchers.append(cluster.start(host, command, env=env, log=cluster.shared / f"{run_dir.name}-{host}.log"))
    deadline = time.monotonic() + JOB_SECONDS
    for host, launcher in enumerate(launchers):
        launcher.wait(timeout=max(deadline - time.monotonic(), 1))
        log = (cluster.shared / f"{run_dir.name}-{host}.log").read_text()
        assert launcher.returncode == 0, f"host {host}:\n{log[-3000:]}"
        assert "socket.cpp" not in log, "torch's store warnings reached the terminal"


def train_on_one_host(job: str, run_dir, env) -> None:
    subprocess.run([sys.executable, "-m", "shoal", "train", job, "--workers", "2", "--run-dir", str(run_dir)],
                   env=env, check=True, capture_output=True, timeout=JOB_SECONDS)


def test_a_host_reaches_the_other_through_its_own_interface(two_hosts, project_env):
    code = f"from shoal.cluster.interface import interface_to; print(interface_to('{two_hosts.address(0)}'))"
    assert two_hosts.run(1, [sys.executable, "-c", code], env=project_env).strip() == "eth0"
    hosts = two_hosts.run(1, ["sh", "-c", "hostname; getent hosts $(hostname)"], env=project_env).split()
    assert hosts[:2] == ["host1", "127.0.1.1"]  # as on a stock Debian box: the trap gloo fell into


@pytest.mark.parametrize("algorithm", ["sync", "averaging"])
def test_two_hosts_end_with_the_weights_of_one(two_hosts, project_env, tmp_path, algorithm):
    job = write_job(two_hosts.shared, algorithm)
    train_on_two_hosts(two_hosts, job, two_hosts.shared / f"run-{algorithm}", project_env)
    train_on_one_host(job, tmp_path / "one", project_env)
    apart, together = load_model(two_hosts.shared / f"run-{algorithm}"), load_model(tmp_path / "one")
    for (name, tensor), other in zip(apart.state_dict().items(), together.state_dict().values()):
        assert torch.equal(tensor, other), name


@pytest.mark.parametrize(("algorithm", "options"), [("downpour", ["--interface", "eth0"]), ("easgd", [])])
def test_server_algorithms_train_across_two_hosts(two_hosts, project_env, algorithm, options):
    job = write_job(two_hosts.shared, algorithm)
    run_dir = two_hosts.shared / f"run-{algorithm}"
    train_on_two_hosts(two_hosts, job, run_dir, project_env, *options)
    assert (run_dir / "model.pt").is_file()
