"""shoal's own launcher as an environment: told from torchrun by the variable naming the parent, and asked
for its capabilities (who records failures, holds the store and the run directory, checked memory, and
which process a worker ends with) instead of any module asking which launcher it runs under."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import shoal.cluster.orphan
import shoal.train.runner
from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo, agree_attempt, get_dist_info
from shoal.cluster.environments import ENVIRONMENTS, Environment, ShoalLauncher, TorchElastic, detect, named
from shoal.cluster.environments.shoal_launcher import LAUNCHER_VARIABLE
from shoal.cluster.orphan import end_with_parent
from shoal.train.exits import outside_recorder
from shoal.train.runner import Runner
from tests.support.pids import unused_pid

PACKAGE = Path(__file__).resolve().parents[3] / "src" / "shoal"
TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
OTHERS = [environment for environment in ENVIRONMENTS if environment is not ShoalLauncher]


@pytest.fixture
def dead_pid() -> int:
    """The pid of a launcher that has ended: one no process has."""
    return unused_pid()


def under_shoal(**more: str) -> dict[str, str]:
    """A worker's variables as shoal's launcher (this test's parent, for the test) sets them."""
    return {**TORCHRUN, **ShoalLauncher.variables(os.getppid()), **more}


def test_shoals_launcher_comes_before_torchrun_whose_variables_it_also_sets(monkeypatch):
    for name in (*TORCHRUN, LAUNCHER_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    for name, value in under_shoal().items():
        monkeypatch.setenv(name, value)
    info = get_dist_info()
    assert info.launcher == ShoalLauncher.name and (info.rank, info.world_size) == (1, 2)
    assert isinstance(detect(under_shoal()), ShoalLauncher)


def test_a_variable_naming_a_live_process_other_than_the_parent_is_torchrun():
    environment = detect({**TORCHRUN, LAUNCHER_VARIABLE: "1"})  # init lives, and is not this test's parent
    assert type(environment) is TorchElastic and environment.launcher_pid() is None
    assert type(detect({**TORCHRUN, LAUNCHER_VARIABLE: "not a pid"})) is TorchElastic


def test_a_process_of_the_launcher_that_torch_did_not_number_is_rank_0_of_1():
    place = ShoalLauncher(ShoalLauncher.variables(os.getppid())).place()
    assert (place.rank, place.world_size, place.local_rank, place.local_world_size) == (0, 1, 0, 1)


def test_named_gives_the_detected_class_and_nothing_for_a_process_alone():
    assert named(ShoalLauncher.name) is ShoalLauncher and named(TorchElastic.name) is TorchElastic
    assert named(None) is Environment and named("something else") is Environment


# ---------------------------------------------------------------- one test per capability


def test_only_shoals_launcher_records_failures_so_its_workers_keep_no_recorder():
    assert ShoalLauncher.records_failures and not any(environment.records_failures for environment in OTHERS)
    # asked under shoal's launcher, the workers leave the failure to it: no store is even opened
    assert outside_recorder(DistInfo(world_size=2, launcher=ShoalLauncher.name)) is None


def test_only_torchruns_store_outlives_a_restart_so_only_its_workers_count_attempts(monkeypatch):
    assert TorchElastic.keeps_store_across_restarts and not ShoalLauncher.keeps_store_across_restarts
    assert [environment for environment in ENVIRONMENTS if environment.keeps_store_across_restarts] == [TorchElastic]
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    master = ("127.0.0.1", 1)
    assert agree_attempt(DistInfo(world_size=2, launcher=TorchElastic.name), master, 1.0) == (3, {})
    assert agree_attempt(DistInfo(world_size=2, launcher=ShoalLauncher.name), master, 1.0) == (0, {})


class Prepared(Exception):
    """Raised in place of preparing the job: what the runner asked for is all the test needs."""


@pytest.mark.parametrize(("launcher", "checked"), [(ShoalLauncher.name, True), (TorchElastic.name, False),
                                                   (None, False)])
def test_the_runner_skips_the_memory_check_only_after_a_launcher_that_made_it(monkeypatch, tmp_path, launcher,
                                                                              checked):
    assert ShoalLauncher.checks_memory and not any(environment.checks_memory for environment in OTHERS)
    asked = {}

    def prepare(job, memory_checked, run_dir):
        asked["memory_checked"] = memory_checked
        raise Prepared

    monkeypatch.setattr(shoal.train.runner, "prepare", prepare)
    job = SimpleNamespace(train=SimpleNamespace(epochs=1), cluster=SimpleNamespace(device="cpu"))
    runner = Runner(job, DistInfo(launcher=launcher), tmp_path, threads=1, comm=Communicator(0, 1))
    with pytest.raises(Prepared):
        runner.setup()
    assert asked == {"memory_checked": checked}


def test_only_shoals_launcher_holds_the_run_directory_for_its_workers():
    assert ShoalLauncher.holds_run_dir and not any(environment.holds_run_dir for environment in OTHERS)
    assert not named(None).holds_run_dir  # a worker started alone holds its own


def test_a_worker_ends_with_the_launcher_its_environment_names(monkeypatch, dead_pid):
    assert ShoalLauncher(under_shoal()).launcher_pid() == os.getppid()
    assert all(environment(TORCHRUN).launcher_pid() is None for environment in OTHERS)
    gone = ShoalLauncher({**TORCHRUN, LAUNCHER_VARIABLE: str(dead_pid)})
    assert ShoalLauncher.detect(gone.environ) and gone.launcher_pid() == dead_pid
    stopped = []
    monkeypatch.setattr(shoal.cluster.orphan, "_stop", stopped.append)
    end_with_parent(60, launcher=gone.launcher_pid())
    assert stopped == [dead_pid]  # started after its launcher died: it stops at once


def test_a_forked_worker_ends_with_the_server_only_while_shoals_launcher_lives(dead_pid):
    assert ShoalLauncher(under_shoal()).worker_ends_with_server()
    assert not ShoalLauncher({**TORCHRUN, LAUNCHER_VARIABLE: str(dead_pid)}).worker_ends_with_server()
    assert not any(environment(TORCHRUN).worker_ends_with_server() for environment in OTHERS)


# ---------------------------------------------------------------- the layout


def test_no_module_outside_the_environments_reads_shoals_launcher_variable():
    """Which launcher started a process is the environments' to say; everyone else asks their capabilities."""
    environments = PACKAGE / "cluster" / "environments"
    readers = [str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
               if environments not in path.parents
               and any(name in path.read_text() for name in ("SHOAL_LAUNCHER_PID", "LAUNCHER_VARIABLE",
                                                             "under_shoal_launcher"))]
    assert readers == []
