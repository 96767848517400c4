"""A dilated emulated cluster (more hosts than cores: each host half a core and half the link's rate) trains a
tiny job across 4 hosts to exactly the weights of the same job by 4 workers on this machine."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from shoal.run.artifacts import load_model
from tests.cluster.hosts import EmulatedCluster, missing_requirements
from tests.cluster.jobs import OneHostRun, start_on_every_host, wait_for_nodes, write_job

HOSTS, DILATION = 4, 2
SECONDS = 240  # four hosts of half a core each start a launcher, a fork server and a worker apiece


@pytest.fixture(scope="module")
def dilated():
    reason = missing_requirements(HOSTS, DILATION)
    if reason:
        pytest.skip(reason)
    with EmulatedCluster(hosts=HOSTS, rate="1gbit", dilation=DILATION) as cluster:
        yield cluster


def test_a_dilated_host_has_its_share_of_a_core_and_of_the_link(dilated, project_env):
    assert max(dilated.cores.count(core) for core in dilated.cores) <= DILATION  # D hosts to a core at most
    groups = dilated.run(3, ["cat", "/proc/self/cgroup"], env=project_env)
    assert f"{dilated.prefix}-h3" in groups  # the host's processes (and their children) are in its cgroup
    limits = [((group / "cpu.cfs_quota_us").read_text().strip(), (group / "cpu.cfs_period_us").read_text().strip())
              if (group / "cpu.cfs_quota_us").exists() else tuple((group / "cpu.max").read_text().split())
              for group in dilated.cgroups]
    slice_us = 1000 * dilated.slice_ms
    assert limits == [(str(slice_us), str(slice_us * DILATION))] * HOSTS  # a slice in every DILATION slices
    keeping = [os.sched_getaffinity(keeper.pid) for keeper in dilated.keepers]
    assert keeping == [{core} for core in sorted(set(dilated.cores))]  # a keeper on each core the hosts use
    assert {os.sched_getscheduler(keeper.pid) for keeper in dilated.keepers} == {os.SCHED_IDLE}
    # and a host's process finds its quota, as one in a container finds the container's CPU limit
    quota = dilated.run(2, [sys.executable, "-c", "from shoal.plan.cpu_quota import cpu_quota; print(cpu_quota())"],
                        env=project_env)
    assert quota.strip() == f"Quota(cores={1 / DILATION}, period={slice_us * DILATION / 1e6})"
    shaped = dilated.run(1, ["tc", "qdisc", "show", "dev", "eth0"], env=project_env)
    assert "rate 500Mbit" in shaped


@pytest.mark.timeout(SECONDS * 1.5)
def test_four_dilated_hosts_end_with_the_weights_of_four_local_workers(dilated, project_env, tmp_path):
    job = write_job(dilated.shared, "sync")
    with OneHostRun(job, tmp_path / "one", project_env, workers=HOSTS, seconds=SECONDS) as alone:
        run_dir = dilated.shared / "run-sync"
        launchers = start_on_every_host(dilated, job, run_dir, project_env)
        wait_for_nodes(launchers, [dilated.shared / f"run-sync-host{host}.log" for host in range(HOSTS)], SECONDS)
        apart, together = load_model(run_dir), load_model(alone.wait())
    for (name, tensor), other in zip(apart.state_dict().items(), together.state_dict().values()):
        assert torch.equal(tensor, other), name
