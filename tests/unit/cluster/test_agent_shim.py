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
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, Worker, WorkerSpec
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import PContext

from shoal.cluster.node import agent, launch
from shoal.cluster.node.agent import SHUTDOWN_SECONDS, NodeAgent, node_of_rank, worker_ranks

SOURCE = Path(agent.__file__).parents[2]  # src/shoal
PRIVATE = ("_exit_barrier", "_start_workers", "_pcontext", "_assign_worker_ranks")


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_members_the_shim_overrides_are_there_with_the_parameters_it_expects():
    assert parameters(LocalElasticAgent._start_workers) == ["self", "worker_group"]
    assert parameters(SimpleElasticAgent._exit_barrier) == ["self"]
    assert parameters(SimpleElasticAgent._assign_worker_ranks) == ["self", "store", "group_rank", "group_world_size",
                                                                    "spec"]
    assert parameters(NodeAgent._assign_worker_ranks) == parameters(SimpleElasticAgent._assign_worker_ranks)
    assert parameters(Worker) == ["local_rank", "global_rank", "role_rank", "world_size", "role_world_size"]
    close = inspect.signature(PContext.close).parameters
    assert list(close) == ["self", "death_sig", "timeout"]
    assert close["death_sig"].default is None


def test_torch_still_calls_them_where_the_shim_counts_on_it():
    # the exit barrier on success, the process context set by _start_workers and closed on shutdown, the
    # ranks from the node's rendezvous, which every worker's RANK and WORLD_SIZE come from
    assert "self._exit_barrier()" in inspect.getsource(SimpleElasticAgent._invoke_run)
    assert re.search(r"workers = self\._assign_worker_ranks\(\s*store, group_rank, group_world_size, spec\s*\)",
                     inspect.getsource(SimpleElasticAgent._rendezvous))
    assert "worker_group.workers = workers" in inspect.getsource(SimpleElasticAgent._rendezvous)
    starting = inspect.getsource(LocalElasticAgent._start_workers)
    for variable in ('"RANK": str(worker.global_rank)', '"WORLD_SIZE": str(worker.world_size)',
                     '"LOCAL_WORLD_SIZE": str(spec.local_world_size)'):
        assert variable in starting
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


def spec(workers: int) -> WorkerSpec:
    return WorkerSpec(role="worker", local_world_size=workers, entrypoint="python", rdzv_handler=Handler())


@pytest.mark.parametrize(("counts", "node", "ranks"), [([2, 1], 0, [0, 1]), ([2, 1], 1, [2]), ([1, 3, 2], 1, [1, 2, 3]),
                                                       ([1, 3, 2], 2, [4, 5]), ([4], 0, [0, 1, 2, 3])])
def test_each_machines_workers_get_contiguous_ranks_after_the_machines_before_it(counts, node, ranks):
    assert list(worker_ranks(counts, node)) == ranks
    assert {node_of_rank(counts, rank) for rank in ranks} == {node}
    made = launch.make_agent(Handler(), counts[node], ["job.toml"], "logs", counts=counts)
    workers = made._assign_worker_ranks(None, node, len(counts), spec(counts[node]))  # asks no store
    assert [(worker.local_rank, worker.global_rank, worker.role_rank) for worker in workers] == [
        (local, rank, rank) for local, rank in enumerate(ranks)]
    assert {(worker.world_size, worker.role_world_size) for worker in workers} == {(sum(counts), sum(counts))}


def test_without_counts_every_node_runs_as_many_as_this_one():
    made = launch.make_agent(Handler(), 2, ["job.toml"], "logs")
    assert [worker.global_rank for worker in made._assign_worker_ranks(None, 1, 3, spec(2))] == [2, 3]
    assert made._assign_worker_ranks(None, 1, 3, spec(2))[0].world_size == 6


def test_counts_that_do_not_fit_the_node_are_refused_not_guessed():
    made = launch.make_agent(Handler(), 2, ["job.toml"], "logs", counts=[2, 1])
    with pytest.raises(RuntimeError, match=r"node 1 of 2 runs 2 workers, but the job's counts are \[2, 1\]"):
        made._assign_worker_ranks(None, 1, 2, spec(2))
    with pytest.raises(RuntimeError):
        made._assign_worker_ranks(None, 0, 3, spec(2))


def test_the_launcher_no_longer_asks_torch_to_number_every_node_alike():
    assert "TORCH_ELASTIC_WORKER_IDENTICAL" not in Path(launch.__file__).read_text()
