"""A whole job through the command line: events, model, predictions, failures, torchrun, two nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

import shoal
from shoal.data.format import open_dataset
from shoal.events import read_events
from shoal.run.lock import hold_run_dir
from tests.distributed.harness import free_port
from tests.e2e.jobs import write_job, write_task

TIMEOUT = 180


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("task"))


def shoal_command(*arguments, env, timeout=TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, arguments)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def set_arguments(settings) -> list[str]:
    """`--set KEY=VALUE` for each of `settings`."""
    return [part for setting in settings for part in ("--set", setting)]


def two_nodes(job, folder, project_env, *settings: str) -> list[subprocess.CompletedProcess]:
    """Two nodes of one job on this machine (one worker each), as on two machines: a rendezvous endpoint."""
    endpoint = f"127.0.0.1:{free_port()}"
    overrides = set_arguments(settings)
    nodes = [subprocess.Popen([sys.executable, "-m", "shoal", "train", str(job), "--workers", "1", "--nnodes", "2",
                               "--node-rank", str(rank), "--rdzv-endpoint", endpoint, "--run-dir",
                               str(folder / f"node{rank}"), *overrides],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**project_env, "SHOAL_JOB_SECRET": "7e1d0c9b3a2f4e5d6c7b8a9f0e1d2c3b"})
             for rank in (0, 1)]
    try:
        outputs = [node.communicate(timeout=TIMEOUT) for node in nodes]
        return [subprocess.CompletedProcess(node.args, node.returncode, *output)
                for node, output in zip(nodes, outputs, strict=True)]
    finally:
        for node in nodes:
            node.kill()


def test_train_writes_events_model_and_predictions(task, tmp_path, project_env):
    train, test = task
    job = write_job(tmp_path / "job.toml", train, test)
    run_dir = tmp_path / "run"
    finished = shoal_command("train", job, "--workers", 2, "--run-dir", run_dir, "--set", "train.epochs=3",
                             env=project_env)
    assert finished.returncode == 0, finished.stderr
    assert f"run directory: {run_dir}" in finished.stdout
    assert finished.stdout.count("epoch ") == 3  # plain lines: not a terminal

    events = list(read_events(run_dir))
    kinds = [e["event"] for e in events if e["event"] != "progress"]
    assert kinds == ["job_start", "data_loaded"] + ["epoch_end", "checkpoint"] * 3 + ["job_end"]
    assert [e["epoch"] for e in events if e["event"] == "checkpoint"] == [1, 2, 3]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["epoch-00002", "epoch-00003"]
    start = events[0]
    assert start["world_size"] == 2 and start["config"]["train"]["epochs"] == 3
    assert start["config"]["algorithm"]["name"] == "averaging"
    assert {"shoal", "torch", "python"} <= set(start["versions"])
    for epoch in (e for e in events if e["event"] == "epoch_end"):
        assert epoch["samples"] == 6000
        assert {"loss", "accuracy", "auc"} <= set(epoch["test"])
        assert set(epoch["seconds_split"]) == {"compute", "communication", "data", "evaluation"}
        assert epoch["samples_per_second"] > 0 and len(epoch["workers"]) == 2
    end = events[-1]
    assert end["test"]["accuracy"] > 0.85, end  # the task is learnable
    assert (run_dir / "job.toml").exists() and (run_dir / "model.pt").exists()

    model = shoal.load_model(run_dir)
    features, labels = open_dataset(test).read_all()
    import torch

    with torch.no_grad():
        predicted = model(torch.from_numpy(features)).argmax(dim=1).numpy()
    assert np.mean(predicted == labels) == pytest.approx(end["test"]["accuracy"])

    out = tmp_path / "predictions.parquet"
    finished = shoal_command("predict", run_dir, test, "--out", out, env=project_env)
    assert finished.returncode == 0, finished.stderr
    table = pq.read_table(out).to_pydict()
    assert len(table["prediction"]) == 1000
    assert set(table["prediction"]) <= {"yes", "no"}
    accuracy = np.mean(np.array(table["prediction"]) == np.array(table["label"]))
    assert accuracy == pytest.approx(end["test"]["accuracy"])
    assert np.allclose(np.array(table["probability_no"]) + np.array(table["probability_yes"]), 1.0)

    weights = (run_dir / "model.pt").read_bytes()
    again = shoal_command("train", "--resume", run_dir, env=project_env)  # every epoch is done
    assert again.returncode == 0, again.stderr
    assert (f"shoal: nothing left to train: {run_dir} holds epoch 3 of train.epochs = 3; give --set "
            "train.epochs=N (above 3) to train on") in again.stderr
    assert (run_dir / "model.pt").read_bytes() == weights  # the trained model is the one it was


def test_fit_returns_metrics_and_model(task, tmp_path, monkeypatch):
    train, test = task
    monkeypatch.chdir(tmp_path)
    job = {
        "model": {"layers": [{"dense": 16, "activation": "relu"}, {"dense": 2}]},
        "data": {"train": str(train), "test": str(test)},
        "algorithm": {"name": "sync"},
        "train": {"epochs": 2, "batch_size": 128, "optimizer": {"name": "adam", "lr": 0.01}},
        "output": {"progress": "none"},
    }
    result = shoal.fit(job, workers=1)
    assert result.metrics["accuracy"] > 0.8
    assert len(result.epochs) == 2
    assert result.run_dir.parent.name == "runs"
    assert sum(p.numel() for p in result.model.parameters()) == 20 * 16 + 16 + 16 * 2 + 2

    longer = shoal.resume(result.run_dir, overrides=["train.epochs=3"])  # one more epoch from the checkpoint
    assert [e.epoch for e in longer.epochs] == [1, 2, 3]
    assert longer.metrics["accuracy"] > 0.8


def test_an_error_in_the_user_s_step_keeps_its_traceback_with_the_user_s_lines(task, tmp_path, project_env):
    train, _ = task
    job = tmp_path / "job.toml"
    job.write_text(f"""
[model]
layers = [{{ dense = 2 }}]
[data]
train = "{train}"
[train]
step = "tests.support.own_code:broken_step"
""")
    finished = shoal_command("train", job, "--workers", 1, "--run-dir", tmp_path / "run", env=project_env)
    assert finished.returncode == 2, finished.stderr
    assert "Traceback (most recent call last)" in finished.stderr
    assert 'own_code.py", line ' in finished.stderr and "in shape_of_nothing" in finished.stderr  # the user's frames
    assert finished.stderr.strip().splitlines()[-1].endswith("train.step: ValueError: my step is broken")


def test_a_failing_worker_ends_the_job_with_its_error(task, tmp_path, project_env):
    train, _ = task
    job = tmp_path / "job.toml"
    job.write_text(f"""
[model]
factory = "tests.support.models:failing_on_rank_one"
[data]
train = "{train}"
""")
    finished = shoal_command("train", job, "--workers", 2, "--run-dir", tmp_path / "run", env=project_env)
    assert finished.returncode == 2  # a factory's failure is the job's own: not retried
    last = finished.stderr.strip().splitlines()[-1]
    assert last.startswith("shoal: error: worker rank 1 on ")
    assert last.endswith("RuntimeError: rank one refuses to build its model")


def test_torchrun_runs_the_worker_module(task, tmp_path, project_env):
    train, test = task
    job = write_job(tmp_path / "job.toml", train, test, algorithm="sync")
    run_dir = tmp_path / "run"
    finished = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--log-dir", str(tmp_path / "torchrun-logs"),  # torchrun's default is a /tmp folder it never removes
         "-m", "shoal.worker", str(job), "--run-dir", str(run_dir)],
        capture_output=True, text=True, env=project_env, timeout=TIMEOUT)
    assert finished.returncode == 0, finished.stderr
    end = [e for e in read_events(run_dir) if e["event"] == "job_end"]
    assert end and end[0]["test"]["accuracy"] > 0.8


def test_torchrun_is_refused_a_run_directory_another_job_holds(task, tmp_path, project_env):
    train, test = task
    job = write_job(tmp_path / "job.toml", train, test, algorithm="sync")
    run_dir = tmp_path / "run"
    with hold_run_dir(run_dir):  # as a running job's launcher holds it
        finished = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             "--log-dir", str(tmp_path / "torchrun-logs"), "-m", "shoal.worker", str(job), "--run-dir", str(run_dir)],
            capture_output=True, text=True, env=project_env, timeout=TIMEOUT)
    assert finished.returncode != 0
    assert f"{run_dir}: in use by another shoal job (pid {os.getpid()} on " in finished.stderr, finished.stderr[-2000:]
    assert sorted(path.name for path in run_dir.iterdir()) == [".lock"]  # nothing written into the other's run


def test_two_nodes_join_through_the_rendezvous(task, tmp_path, project_env):
    train, test = task
    job = write_job(tmp_path / "job.toml", train, test)
    nodes = two_nodes(job, tmp_path, project_env, "cluster.threads=1")
    assert [node.returncode for node in nodes] == [0, 0], [(node.stdout, node.stderr) for node in nodes]
    start = next(read_events(tmp_path / "node0"))
    assert start["world_size"] == 2
    assert json.loads(json.dumps(start["hosts"])) == [start["hosts"][0]] * 2
    # each machine's worker writes into the folder its own launcher was given, not the first machine's
    assert [path.name for path in (tmp_path / "node0" / "checkpoints").glob("epoch-*/rank-*.pt")] == \
        ["rank-00000.pt"] * len(list((tmp_path / "node0" / "checkpoints").glob("epoch-*")))
    assert {path.name for path in (tmp_path / "node1" / "checkpoints").glob("epoch-*/rank-*.pt")} == {"rank-00001.pt"}


def test_a_model_that_compiles_trains_with_the_real_compiler(task, tmp_path, project_env):
    """Workers defer torch's compiler (shoal compiles nothing); a user's model that compiles gets the real one."""
    train, test = task
    marker = tmp_path / "compiler"
    model = f'factory = "tests.support.models:compiled"\narguments = {{ marker = "{marker}" }}'
    job = write_job(tmp_path / "job.toml", train, test, algorithm="sync", model=model)
    finished = shoal_command("train", job, "--workers", 2, "--run-dir", tmp_path / "run", env=project_env)
    assert finished.returncode == 0, finished.stderr
    assert marker.read_text() == "module"  # torch's own, not shoal's stand-in
    end = [e for e in read_events(tmp_path / "run") if e["event"] == "job_end"][0]
    assert end["test"]["accuracy"] > 0.8, end
