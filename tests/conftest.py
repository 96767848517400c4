"""Shared fixtures: the shared data folder, no child process outliving its test, none started by a unit test."""

from __future__ import annotations

import os
import platform
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tests.support import no_processes
from tests.support.factories import user_factories

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"

# A suite started in the background (`make test &`) inherits Ctrl-C ignored, and so would every job
# the tests start; the tests that interrupt a job with SIGINT need it heard, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def a9a_dir() -> Path:
    """The a9a LIBSVM files in ../shared/data, or a skip with the reason."""
    folder = SHARED_DATA / "a9a"
    if not (folder / "a9a").exists():
        pytest.skip(f"shared data set missing: {folder} (CI always has it)")
    return folder


UNIT = ROOT / "tests" / "unit"
# The first call of platform.processor() runs `uname -p` and caches it; libraries a unit test imports
# (TensorBoard's writer) call it, and a test run alone would then count their process as its own.
platform.processor()


@contextmanager
def _unit_starts_no_process(item: pytest.Item) -> Iterator[None]:
    """Fail a test under tests/unit that starts a process: it belongs in tests/processes (or e2e, distributed)."""
    if not Path(item.path).is_relative_to(UNIT):
        yield
        return
    with no_processes.watch() as started:
        yield
    assert not started, f"a unit test started processes (move it to tests/processes): {started}"


# Each phase is watched, not the test's body alone: a module's fixture is set up in its first test's setup.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _unit_starts_no_process(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _unit_starts_no_process(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _unit_starts_no_process(item):
        return (yield)


@pytest.fixture
def quiet_environment(monkeypatch):
    """`shoal.cli.main` sets TORCH_CPP_LOG_LEVEL for its workers; the test's environment is put back after."""
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "ERROR")


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A factory module in the current folder (as a user's own module is), not on sys.path."""
    yield from user_factories(tmp_path, monkeypatch)


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Fail a test that leaves child processes behind, after ending them."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    leftover = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and not _helper(p)]
    for process in leftover:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(leftover, timeout=5)
    alive = [p for p in leftover if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"test left processes behind: {[p.pid for p in alive]}"


def _helper(process: psutil.Process) -> bool:
    """multiprocessing's own long-lived helpers, not a leftover worker: the resource tracker, and the fork
    server tests.distributed.harness starts its ranks from (this process's child; the ranks forked from
    it bear its command line too, but are its children)."""
    try:
        command = " ".join(process.cmdline())
        server = "multiprocessing.forkserver" in command and process.ppid() == os.getpid()
        return "resource_tracker" in command or server
    except psutil.Error:
        return False


def _project_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture
def project_env() -> dict:
    """Environment for subprocesses that run shoal from the project's root."""
    return _project_env()


@pytest.fixture(scope="module")
def project_env_module() -> dict:
    return _project_env()
