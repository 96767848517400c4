"""A real SLURM on the emulated cluster (slurmctld on host 0, a slurmd on each host): a batch job's
`srun` trains across both hosts with nothing exported, SLURM's warning before the time limit
(SIGUSR1) stops it at an epoch's end with a checkpoint, the job requeues itself, and the requeued
job continues to the weights of an uninterrupted run. A step of 3 tasks on the 2 hosts (2 on host0, 1 on
host1) numbers each rank as srun placed it and trains to the weights of 3 workers on one machine."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from shoal.events import read_events
from shoal.run.artifacts import load_model
from tests.cluster.jobs import JOB_SECONDS, write_job, write_sabotaged_job
from tests.cluster.slurm import EmulatedSlurm, missing_requirements

SECONDS = 150


@pytest.fixture(scope="module")
def slurm(two_hosts, project_env_module):
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    with EmulatedSlurm(two_hosts, project_env_module) as running:
        yield running


def kinds(run_dir) -> list[str]:
    return [event["event"] for event in read_events(run_dir)]


# past its own deadlines (SECONDS for SLURM's part, JOB_SECONDS for the run on one host beside it), which name what hung
@pytest.mark.timeout(SECONDS + 150)
def test_a_warned_batch_job_stops_at_an_epochs_end_requeues_and_continues(slurm, two_hosts, project_env, beside):
    job = write_sabotaged_job(two_hosts.shared, "slurm", delay=0.05, epochs=4)  # 1 s an epoch
    alone = beside(job, project_env)  # the uninterrupted run, while SLURM's job waits on SLURM much of the time
    run_dir = two_hosts.shared / "run-slurm"
    script = two_hosts.shared / "slurm.sh"
    script.write_text(f"#!/bin/sh\nexec srun {sys.executable} -m shoal.worker {job} --run-dir {run_dir}\n")
    submitted = slurm.run(0, ["sbatch", "--parsable", "-N", "2", "--ntasks-per-node", "1", "--requeue",
                              "-o", str(two_hosts.shared / "slurm-%j.out"), str(script)])
    job_id = submitted.strip().split(";")[0]
    deadline = time.monotonic() + SECONDS
    while "epoch_end" not in kinds(run_dir):
        assert time.monotonic() < deadline, slurm.logs()
        time.sleep(0.2)
    slurm.run(0, ["scancel", "--signal=USR1", job_id])  # as `sbatch --signal=USR1@120` does before the limit
    while "job_end" not in kinds(run_dir) or kinds(run_dir)[-1] != "job_end" or \
            list(read_events(run_dir))[-1]["status"] != "completed":
        assert time.monotonic() < deadline, "\n".join(kinds(run_dir)) + slurm.logs()
        time.sleep(0.5)
    events = list(read_events(run_dir))
    ends = [event for event in events if event["event"] == "job_end"]
    assert [end["status"] for end in ends] == ["interrupted", "completed"], ends
    stopped_at = int(ends[0]["message"].split("epoch ")[1].split()[0])
    assert [event["from_epoch"] for event in events if event["event"] == "job_resumed"] == [stopped_at]
    assert [event["hosts"] for event in events if event["event"] == "job_start"][0] == ["host0", "host1"]
    reference = load_model(alone.wait(), trust_code=True).state_dict()  # the test's own factory
    for name, tensor in load_model(run_dir, trust_code=True).state_dict().items():
        assert tensor.equal(reference[name]), name
    state = slurm.run(0, ["scontrol", "show", "job", job_id])
    assert "Restarts=1" in state, state


# srun -n3 on two nodes of one CPU each: --overcommit lets host0 take two tasks, block distribution fills it first
UNEVEN_STEP = ["srun", "-N", "2", "-n", "3", "--distribution=block", "--overcommit"]
PLACE = ("from shoal.cluster.env import get_dist_info; place = get_dist_info(); "
         "print(place.launcher, place.rank, place.world_size, place.local_rank, place.local_world_size, place.host)")


@pytest.mark.timeout(3 * JOB_SECONDS)
def test_a_step_with_2_tasks_on_one_host_and_1_on_the_other_numbers_each_and_trains(slurm, two_hosts, project_env,
                                                                                     tmp_path):
    # SLURM_TASKS_PER_NODE is "2,1" here: each task's local world size is its own node's count
    told = slurm.run(0, [*UNEVEN_STEP, sys.executable, "-c", PLACE], timeout=JOB_SECONDS)
    assert sorted(told.split("\n")[:-1]) == ["SLURM 0 3 0 2 host0", "SLURM 1 3 1 2 host0", "SLURM 2 3 0 1 host1"]
    job = write_job(two_hosts.shared, "sync")
    run_dir = two_hosts.shared / "run-slurm-uneven"
    slurm.run(0, [*UNEVEN_STEP, sys.executable, "-m", "shoal.worker", job, "--run-dir", str(run_dir)],
              timeout=JOB_SECONDS)
    events = list(read_events(run_dir))
    assert [event["status"] for event in events if event["event"] == "job_end"] == ["completed"]
    assert next(event for event in events if event["event"] == "job_start")["world_size"] == 3
    last = [event for event in events if event["event"] == "epoch_end"][-1]
    assert {worker["rank"]: worker["host"] for worker in last["workers"]} == {0: "host0", 1: "host0", 2: "host1"}
    local = subprocess.run([sys.executable, "-m", "shoal", "train", job, "--workers", "3", "--run-dir",
                            str(tmp_path / "one")], capture_output=True, text=True, env=project_env,
                           timeout=JOB_SECONDS)
    assert local.returncode == 0, local.stderr[-3000:]
    reference = load_model(tmp_path / "one").state_dict()
    # the same gradients averaged, though gloo may add float32s in another order across machines than on one
    for name, tensor in load_model(run_dir).state_dict().items():
        assert torch.allclose(tensor, reference[name], atol=1e-6, rtol=0), name
