"""Other launchers start the workers on one machine: Open MPI's mpirun (rank 0's address agreed over
MPI by mpi4py, nothing exported) and MPICH's mpiexec (MASTER_* given) train two processes to the
very weights of `shoal train --workers 2`, and a failure under mpirun reaches the job's events."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from shoal.events import read_events
from shoal.run.artifacts import load_model
from shoal.train.exits import WITHOUT_A_WORD
from tests.cluster.jobs import train_on_one_host, write_job, write_sabotaged_job
from tests.distributed.harness import free_port

TIMEOUT = 120


def launcher(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"`{name}` is not installed (make test installs it when run as root)")
    return path


def as_root(name: str) -> list[str]:
    """Open MPI refuses root unless told."""
    return ["--allow-run-as-root"] if name.endswith("openmpi") and os.geteuid() == 0 else []


@pytest.fixture(scope="module")
def job_and_reference(tmp_path_factory, project_env_module):
    folder = tmp_path_factory.mktemp("launchers")
    job = write_job(folder, "sync")
    train_on_one_host(job, folder / "reference", project_env_module)
    return job, load_model(folder / "reference").state_dict()


def assert_same_weights(run_dir, reference: dict) -> None:
    for name, tensor in load_model(run_dir).state_dict().items():
        assert torch.equal(tensor, reference[name]), name


def test_open_mpis_mpirun_needs_no_exported_address(job_and_reference, tmp_path, project_env):
    mpirun = launcher("mpirun.openmpi")
    job, reference = job_and_reference
    environment = {key: value for key, value in project_env.items() if not key.startswith("MASTER_")}
    finished = subprocess.run([mpirun, *as_root(mpirun), "-n", "2", sys.executable, "-m", "shoal.worker", job,
                               "--run-dir", str(tmp_path / "run")], capture_output=True, text=True,
                              env=environment, timeout=TIMEOUT)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_same_weights(tmp_path / "run", reference)
    start = next(event for event in read_events(tmp_path / "run") if event["event"] == "job_start")
    assert start["world_size"] == 2


def test_mpichs_mpiexec_with_the_address_given(job_and_reference, tmp_path, project_env):
    mpiexec = launcher("mpiexec.mpich")
    job, reference = job_and_reference
    finished = subprocess.run([mpiexec, "-n", "2", "-genv", "MASTER_ADDR", "127.0.0.1", "-genv", "MASTER_PORT",
                               str(free_port()), sys.executable, "-m", "shoal.worker", job, "--run-dir",
                               str(tmp_path / "run")], capture_output=True, text=True, env=project_env,
                              timeout=TIMEOUT)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_same_weights(tmp_path / "run", reference)


def test_a_worker_killed_under_mpirun_is_recorded_by_rank_0(tmp_path, project_env):
    mpirun = launcher("mpirun.openmpi")
    job = write_sabotaged_job(tmp_path, "killed", action="kill", at=30, marker=tmp_path / "fired")
    # mpirun's SIGKILL follows its SIGTERM after 1 s by default: more, so a loaded machine cannot miss it
    environment = {**project_env, "OMPI_MCA_odls_base_sigkill_timeout": "5"}
    finished = subprocess.run([mpirun, *as_root(mpirun), "-n", "2", sys.executable, "-m", "shoal.worker", job,
                               "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, env=environment,
                              timeout=TIMEOUT)
    assert finished.returncode != 0 and (tmp_path / "fired").exists(), finished.stderr[-3000:]
    events = list(read_events(tmp_path / "run"))
    failed = [event for event in events if event["event"] == "worker_failed"]
    assert [(event["rank"], event["message"]) for event in failed] == [(1, WITHOUT_A_WORD)], finished.stderr[-2000:]
    assert events[-1]["event"] == "job_end" and events[-1]["status"] == "failed"
    assert "rank 1" in events[-1]["message"]
