"""A real SLURM on the emulated cluster (slurmctld on host 0, a slurmd on each host): a batch job's
`srun` trains across both hosts with nothing exported, SLURM's warning before the time limit
(SIGUSR1) stops it at an epoch's end with a checkpoint, the job requeues itself, and the requeued
job continues to the weights of an uninterrupted run."""

from __future__ import annotations

import sys
import time

import pytest

from shoal.events import read_events
from shoal.train.artifacts import load_model
from tests.cluster.jobs import train_on_one_host, write_sabotaged_job
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


# past its own deadlines (SECONDS for SLURM's part, then a run on one host), which name what hung
@pytest.mark.timeout(SECONDS + 150)
def test_a_warned_batch_job_stops_at_an_epochs_end_requeues_and_continues(slurm, two_hosts, project_env, tmp_path):
    job = write_sabotaged_job(two_hosts.shared, "slurm", delay=0.05, epochs=4)  # 1 s an epoch
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
    train_on_one_host(job, tmp_path / "one", project_env)
    reference = load_model(tmp_path / "one", trust_code=True).state_dict()  # the test's own factory
    for name, tensor in load_model(run_dir, trust_code=True).state_dict().items():
        assert tensor.equal(reference[name]), name
    state = slurm.run(0, ["scontrol", "show", "job", job_id])
    assert "Restarts=1" in state, state
