"""The emulated cluster as a fixture: built once per test module, torn down with nothing left."""

from __future__ import annotations

import pytest

from tests.cluster.hosts import EmulatedCluster, missing_requirements


@pytest.fixture(scope="module")
def two_hosts():
    reason = missing_requirements(2)
    if reason:
        pytest.skip(reason)
    with EmulatedCluster(hosts=2, rate="1gbit") as cluster:
        yield cluster
