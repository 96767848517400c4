"""shoal.cluster.node.agent overrides private members of torch's elastic agent: these tests fail as soon as a torch
release renames them, changes their parameters or stops calling them, and when a module other than the shim
starts touching them. No process is started.
"""

from __future__ import annotations

import inspect
import re
import signal
from pathlib import Path

import pytest
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import PContext

from shoal.cluster.node import agent, launch
from shoal.cluster.node.agent import SHUTDOWN_SECONDS, NodeAgent

SOURCE = Path(agent.__file__).parents[2]  # src/shoal
PRIVATE = ("_exit_barrier", "_start_workers", "_pcontext")


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_members_the_shim_overrides_are_there_with_the_parameters_it_expects():
    assert parameters(LocalElasticAgent._start_workers) == ["self", "worker_group"]
    assert parameters(SimpleElasticAgent._exit_barrier) == ["self"]
    close = inspect.signature(PContext.close).parameters
    assert list(close) == ["self", "death_sig", "timeout"]
    assert close["death_sig"].default is None


def test_torch_still_calls_them_where_the_shim_counts_on_it():
    # the exit barrier on success, the process context set by _start_workers and closed on shutdown
    assert "self._exit_barrier()" in inspect.getsource(SimpleElasticAgent._invoke_run)
    assert "self._pcontext = start_processes(" in inspect.getsource(LocalElasticAgent._start_workers)
    assert re.search(r"self\._pcontext\.close\(death_sig, timeout\)", inspect.getsource(LocalElasticAgent._shutdown))


class FakeContext:
    def __init__(self):
        self.closed = []

    def close(self, death_sig=None, timeout=30):
        self.closed.append((death_sig, timeout))


def test_a_failure_stops_the_other_workers_within_shoal_grace_time(monkeypatch):
    context = FakeContext()

    def start(self, worker_group):
        self._pcontext = context
        return {0: 123}

    monkeypatch.setattr(LocalElasticAgent, "_start_workers", start)
    node = NodeAgent.__new__(NodeAgent)  # no rendezvous needed: only the override runs
    assert node._start_workers(None) == {0: 123}
    node._pcontext.close(signal.SIGTERM, 30)  # torch's default grace time
    node._pcontext.close(signal.SIGKILL, 1)
    assert context.closed == [(signal.SIGTERM, SHUTDOWN_SECONDS), (signal.SIGKILL, 1)]
    assert node._exit_barrier() is None  # asks no shared store


def test_no_module_but_the_shim_touches_torchs_private_agent_members():
    touching = [path.relative_to(SOURCE).as_posix() for path in SOURCE.rglob("*.py")
                if path != Path(agent.__file__) and any(re.search(rf"\.{name}\b|def {name}\b", path.read_text())
                                                       for name in PRIVATE)]
    assert touching == []


class Handler:
    """What the agent asks of a rendezvous handler as it is made."""

    def get_run_id(self) -> str:
        return "shim"


@pytest.mark.parametrize("switch", ["", "1"])
def test_the_agent_starts_a_command_or_from_torchs_forkserver_a_function(monkeypatch, switch):
    monkeypatch.setenv(launch.TORCH_FORKSERVER, switch)
    made = launch.make_agent(Handler(), 2, ["job.toml"], "logs", variables={"OMP_NUM_THREADS": "1"})
    spec = made._worker_group.spec
    assert isinstance(made, NodeAgent)
    if switch:
        assert (spec.entrypoint, made._start_method) == (launch.worker_function, "forkserver")
        assert spec.args == ('{"OMP_NUM_THREADS": "1"}', "job.toml")
    else:
        assert (made._start_method, spec.args) == ("spawn", ("-u", "-m", "shoal.worker", "job.toml"))
