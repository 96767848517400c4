"""The runner and the training loop call an algorithm's hooks only, never ask its family: an algorithm with no
server logic at all (no plan, no version, no serving) runs through every call the runner makes, and the server
hooks' defaults do nothing. A rank that only waited on a quiet peer raises PeerLost naming that peer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shoal.train
from shoal.algorithms import Algorithm
from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.cluster.heartbeat import Heartbeat
from shoal.errors import PeerLost, lost_peer
from shoal.train import runner as runner_module
from shoal.train.runner import Runner
from tests.unit.train.test_runner import job

TRAIN = Path(shoal.train.__file__).parent


class Recording(Algorithm):
    """Plain base-class hooks, each call written down."""

    name = "recording"

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []
        self.steps: list[int] = []

    def setup(self, model, optimizer, comm, on_update=None) -> None:
        super().setup(model, optimizer, comm, on_update)
        self.calls.append(("setup", callable(on_update)))

    def shares_changed(self, steps_by_trainer: dict[int, int]) -> None:
        super().shares_changed(steps_by_trainer)
        self.calls.append(("shares_changed", dict(steps_by_trainer)))

    def after_step(self, step: int) -> None:
        self.steps.append(step)

    def end_epoch(self, epoch: int) -> None:
        self.calls.append(("end_epoch", epoch))


def test_an_algorithm_without_server_logic_runs_through_the_runners_calls(tmp_path, monkeypatch):
    algorithm = Recording()
    monkeypatch.setattr(runner_module, "make_algorithm", lambda name, options, groups: algorithm)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runner = Runner(job(tmp_path, epochs=2), DistInfo(), run_dir, threads=1, comm=Communicator(0, 1))
    metrics = runner.run()
    steps = runner.steps
    assert algorithm.calls == [("setup", True), ("shares_changed", {0: steps}), ("end_epoch", 0), ("end_epoch", 1)]
    assert algorithm.steps == list(range(1, 2 * steps + 1))
    assert set(metrics) >= {"loss", "accuracy"}
    assert not any(hasattr(algorithm, name) for name in ("plan", "version", "serve_epoch", "updates_this_epoch"))


def test_the_server_hooks_do_nothing_by_default():
    algorithm = Algorithm()
    algorithm.shares_changed({0: 3, 1: 5})
    assert algorithm.counts_nominal_steps


def isinstance_of_algorithms(path: Path) -> list[str]:
    """`isinstance(x, SomethingAlgorithm)` calls in a module, as `file:line`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            named = [part.id for part in ast.walk(node.args[1]) if isinstance(part, ast.Name)]
            if any(name.endswith("Algorithm") for name in named):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_training_never_asks_an_algorithms_family():
    assert [found for path in sorted(TRAIN.rglob("*.py")) for found in isinstance_of_algorithms(path)] == []


def test_a_rank_that_waited_on_a_quiet_peer_raises_peer_lost(tmp_path, monkeypatch):
    quiet = {"rank": 1, "host": "box1", "step": 67, "silent_for": 31.2}
    monkeypatch.setattr(Heartbeat, "blame", lambda self, gap=None: quiet)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runner = Runner(job(tmp_path), DistInfo(), run_dir, threads=1, comm=Communicator(0, 1))

    def timed_out(epoch):
        raise RuntimeError("[gloo/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete")

    runner.run_epoch = timed_out
    with pytest.raises(PeerLost, match=r"^worker rank 1 on box1 stopped answering at step 67 .*rank 0 waited for it") \
            as raised:
        runner.run()
    assert lost_peer(raised.value)
    runner.heartbeat.close()
