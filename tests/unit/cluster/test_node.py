"""One node's launcher as one package: the fork server handed down, not found through a global, and
`shoal.fit` taking the tree `shoal train` takes. No process is started: the fork server is a stand-in object."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

import shoal.api as api
from shoal import cli
from shoal.cluster.node import forkserver, launch, supervisor
from shoal.errors import WorkerError


class FakeServer:
    """What the launcher asks of a fork server, recording whether it was closed."""

    closed = False

    def arguments(self, worker):
        return ["-m", forkserver.STAND_IN, "socket", forkserver.WORKER_MODULE, *worker]

    def close(self):
        self.closed = True


@pytest.fixture
def fake_server(monkeypatch):
    server = FakeServer()
    monkeypatch.setattr(forkserver, "start", lambda module=forkserver.WORKER_MODULE: server)
    return server


def test_no_module_holds_a_running_fork_server():
    """The CLI and the launcher are linked by arguments only: no module-level fork server to set or read."""
    for module in (forkserver, launch, supervisor, cli, api):
        assert not hasattr(module, "_running") and not hasattr(module, "running")
    assert "server" in inspect.signature(launch.launch).parameters
    assert "server" in inspect.signature(api.start).parameters
    assert "server" in supervisor.NodeJob.__dataclass_fields__
    assert "restart_record" in dir(supervisor.JobHooks)  # training's record, handed in with the job


def test_the_launcher_package_imports_nothing_from_training():
    """The supervisor lives in shoal.cluster: what it needs from training (a restart's record) is handed in."""
    source = inspect.getsource(supervisor)
    assert "shoal.train" not in source.replace("(training's shoal.train.exits)", "")


def test_serving_closes_its_server_however_the_block_ends(fake_server):
    with pytest.raises(RuntimeError), forkserver.serving() as server:
        assert server is fake_server
        raise RuntimeError("the job failed")
    assert fake_server.closed
    with forkserver.serving(wanted=False) as server:
        assert server is None


def test_fit_hands_its_fork_server_down_and_stops_it_when_the_job_fails(fake_server, monkeypatch, tmp_path):
    handed = {}

    def start(job, run_dir, nodes=None, **options):
        handed.update(options)
        assert not fake_server.closed  # alive while the workers run
        raise WorkerError("worker rank 0 on here failed: on purpose")

    monkeypatch.setattr(api, "start", start)
    with pytest.raises(WorkerError, match="on purpose"):
        api.fit({"model": {"input": [4], "layers": [{"dense": 2}]}, "data": {"train": str(tmp_path)}},
                run_dir=tmp_path / "run")
    assert handed["server"] is fake_server and fake_server.closed


def test_resume_hands_its_fork_server_down_and_stops_it(fake_server, monkeypatch, tmp_path):
    handed = {}
    job = SimpleNamespace(model=SimpleNamespace(factory=None, object=None))
    monkeypatch.setattr(api, "resumed_job", lambda run_dir, overrides, trust_code: job)
    monkeypatch.setattr(api, "start", lambda job, run_dir, **options: handed.update(options))
    monkeypatch.setattr(api, "result", lambda run_dir, trust_code: "result")
    assert api.resume(tmp_path) == "result"
    assert handed["server"] is fake_server and fake_server.closed
