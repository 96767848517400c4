"""The emulated cluster as a fixture: built once per test module, torn down with nothing left; and runs on this
machine started beside a test's run on the hosts."""

from __future__ import annotations

import contextlib

import pytest

from tests.cluster.hosts import EmulatedCluster, missing_requirements
from tests.cluster.jobs import OneHostRun


@pytest.fixture(scope="module")
def two_hosts():
    reason = missing_requirements(2)
    if reason:
        pytest.skip(reason)
    with EmulatedCluster(hosts=2, rate="1gbit") as cluster:
        yield cluster


@pytest.fixture
def beside(tmp_path):
    """`beside(job, env)`: a `shoal train` run of `job` by 2 workers on this machine, in tmp_path/one, started now
    (tests.cluster.jobs.OneHostRun); whatever of it still runs at the test's end is ended."""
    with contextlib.ExitStack() as stack:
        def start(job, env) -> OneHostRun:
            return stack.enter_context(OneHostRun(job, tmp_path / "one", env))

        yield start
