"""Starting a job has one owner (shoal.launching): the machines' rules before any folder is made, the launch
as the supervisor's hooks, and rank 0 under torchrun, srun or mpirun writing the run's job.toml as a launch
does. No process is started."""

from __future__ import annotations

import inspect
import tomllib

import pytest

from shoal.cluster.node import supervisor
from shoal.cluster.node.rendezvous import Nodes
from shoal.errors import ShoalError
from shoal.launching import Launch, resolve_job
from shoal.worker import launched


def job():
    return resolve_job({"model": {"input": [4], "layers": [{"dense": 2}]}, "data": {"train": "train"},
                        "output": {"progress": "none"}})


@pytest.mark.parametrize(("nodes", "message"), [
    (Nodes(count=2, minimum=2, rank=2, insecure=True), "--node-rank: must be in 0..1, got 2"),
    (Nodes(count=3, minimum=1, rank=1, insecure=True),
     "--node-rank: with --nnodes 1:3 machines are numbered as they join: give none (the endpoint's machine is node 0)"),
    (Nodes(count=2, minimum=2, rank=0, endpoint="127.0.0.1:29400"),
     "--rdzv-endpoint 127.0.0.1:29400: a job of several machines needs a secret"),
])
def test_a_node_outside_the_machines_or_without_a_secret_is_refused_before_any_folder(nodes, message, tmp_path):
    with pytest.raises(ShoalError) as refused:
        Launch.create(job(), tmp_path / "run", nodes)
    assert str(refused.value).startswith(message)
    assert not (tmp_path / "run").exists()


def test_several_machines_name_one_run_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ShoalError, match=r"^--run-dir: required with --nnodes > 1"):
        Launch.create(job(), None, Nodes(count=2, minimum=2, rank=0, insecure=True))
    assert Launch.create(job(), None).run_dir.parent.name == "runs"  # one machine: a dated folder of its own
    assert not (tmp_path / "runs").exists()


def test_a_resume_keeps_its_folder_and_a_new_run_refuses_one_that_holds_a_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text("")
    assert Launch.create(job(), run_dir, resume=True).run_dir == run_dir
    with pytest.raises(ShoalError, match="already holds a run"):
        Launch.create(job(), run_dir)


def test_the_launch_answers_every_hook_the_supervisor_asks_of_training(tmp_path):
    asked = {name: inspect.signature(method) for name, method in vars(supervisor.JobHooks).items()
             if inspect.isfunction(method) and not name.startswith("_")}
    assert set(asked) == {"check_layout", "restart_record", "membership_record"}
    for name, signature in asked.items():
        assert list(inspect.signature(getattr(Launch, name)).parameters) == list(signature.parameters)


def test_the_supervisor_gets_the_launchs_plain_values(tmp_path):
    launch = Launch(job(), tmp_path / "run", max_restarts=2)
    node_job = launch.node_job(tmp_path / "run" / "job.toml")
    assert (node_job.run_dir, node_job.cluster, node_job.max_restarts, node_job.resume) == (
        tmp_path / "run", launch.job.cluster, 2, False)
    assert node_job.datasets == [launch.job.data.train] and not node_job.streamed
    assert len(supervisor.NodeJob.__dataclass_fields__) <= 10


def test_rank_0_under_another_launcher_writes_the_job_as_a_launch_does(tmp_path, monkeypatch):
    """Absolute data paths (a resume from another folder reads the same data), a job.toml already there kept
    (a restarted job's), and the worker's own job left as it was loaded."""
    monkeypatch.chdir(tmp_path)
    loaded, run_dir = job(), tmp_path / "run"
    with launched(loaded, run_dir, resume=False):
        written = tomllib.loads((run_dir / "job.toml").read_text())
        assert (run_dir / ".lock").exists()
    assert written["data"]["train"] == str(tmp_path / "train") and loaded.data.train == "train"
    loaded.train.epochs = 7
    with launched(loaded, run_dir, resume=True):
        assert tomllib.loads((run_dir / "job.toml").read_text()) == written


def test_nothing_that_a_launch_starts_imports_it():
    """The supervisor gets the launch as its hooks, and training, the run directory and the data never reach up to
    the launch: the layers below it stay importable without it (counting imports inside functions)."""
    from tests.unit.test_layout import GRAPH

    below = ("shoal.cluster", "shoal.train", "shoal.run", "shoal.data", "shoal.algorithms", "shoal.events",
             "shoal.config", "shoal.errors")
    assert [name for name, targets in GRAPH.items() if name.startswith(below) and "shoal.launching" in targets] == []
