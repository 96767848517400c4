"""Two hosts on the emulated cluster, started the README's way with no GLOO/NCCL variables set,
whose hostnames resolve to loopback: every algorithm trains, and sync and averaging end with
exactly the weights of the same job (same world size) on one host, started by shoal or by Open MPI."""

from __future__ import annotations

import shutil
import sys

import pytest
import torch

from shoal.events import read_events
from shoal.run.artifacts import load_model
from tests.cluster.jobs import JOB_SECONDS, train_on_two_hosts, write_job


def test_a_host_reaches_the_other_through_its_own_interface(two_hosts, project_env):
    code = f"from shoal.cluster.interface import interface_to; print(interface_to('{two_hosts.address(0)}'))"
    assert two_hosts.run(1, [sys.executable, "-c", code], env=project_env).strip() == "eth0"
    hosts = two_hosts.run(1, ["sh", "-c", "hostname; getent hosts $(hostname)"], env=project_env).split()
    assert hosts[:2] == ["host1", "127.0.1.1"]  # as on a stock Debian box: the trap gloo fell into


@pytest.mark.parametrize("algorithm", ["sync", "averaging"])
def test_two_hosts_end_with_the_weights_of_one(two_hosts, project_env, beside, algorithm):
    job = write_job(two_hosts.shared, algorithm)
    alone = beside(job, project_env)  # while the hosts' run waits on the network and on launches
    train_on_two_hosts(two_hosts, job, two_hosts.shared / f"run-{algorithm}", project_env)
    apart, together = load_model(two_hosts.shared / f"run-{algorithm}"), load_model(alone.wait())
    for (name, tensor), other in zip(apart.state_dict().items(), together.state_dict().values()):
        assert torch.equal(tensor, other), name


@pytest.mark.parametrize(("algorithm", "options", "node_ranks"),
                         [("downpour", ["--interface", "eth0"], True), ("easgd", [], False)])
def test_server_algorithms_train_across_two_hosts(two_hosts, project_env, algorithm, options, node_ranks):
    """Without --node-rank the endpoint's machine is node 0 and the other joins as node 1."""
    job = write_job(two_hosts.shared, algorithm)
    run_dir = two_hosts.shared / f"run-{algorithm}"
    train_on_two_hosts(two_hosts, job, run_dir, project_env, *options, node_ranks=node_ranks)
    assert (run_dir / "model.pt").is_file()


def test_open_mpi_across_two_hosts(two_hosts, project_env, beside):
    """mpirun on host 0 reaches host 1 through the cluster's ssh stand-in; mpi4py tells rank 0's address."""
    mpirun = shutil.which("mpirun.openmpi")
    if mpirun is None:
        pytest.skip("`mpirun.openmpi` is not installed (make test installs it when run as root)")
    job = write_job(two_hosts.shared, "sync")
    run_dir = two_hosts.shared / "run-mpi"
    command = [mpirun, "--allow-run-as-root", "-n", "2", "--host", "host0,host1", "--mca", "plm_rsh_agent",
               str(two_hosts.enter), "--mca", "btl", "tcp,self", sys.executable, "-m", "shoal.worker", job,
               "--run-dir", str(run_dir)]
    log = two_hosts.shared / "mpirun.log"
    alone = beside(job, project_env)  # while the hosts' run waits on the network and on launches
    finished = two_hosts.start(0, command, env=project_env, log=log).wait(timeout=JOB_SECONDS)
    assert finished == 0, log.read_text()[-3000:]
    for (name, tensor), other in zip(load_model(run_dir).state_dict().items(),
                                     load_model(alone.wait()).state_dict().values()):
        assert torch.equal(tensor, other), name
    start = next(event for event in read_events(run_dir) if event["event"] == "job_start")
    assert start["hosts"] == ["host0", "host1"]
