"""A process whose parent dies ends itself (the worker's guard against a SIGKILLed launcher): which parent it
watches (the orphans themselves, with real processes: tests/processes/cluster/test_orphan.py)."""

from __future__ import annotations

import os

import pytest

from shoal.cluster.environments import ShoalLauncher
from shoal.cluster.environments.shoal_launcher import LAUNCHER_VARIABLE


@pytest.mark.parametrize(("value", "expected"), [("parent", True), ("1", False), (None, False)])
def test_only_the_parent_named_in_the_variable_is_shoals_launcher(value, expected):
    """A variable inherited from elsewhere (a caller that ran shoal.fit, then torchrun) is not shoal's launcher."""
    environment = {} if value is None else {LAUNCHER_VARIABLE: str(os.getppid()) if value == "parent" else value}
    assert ShoalLauncher.detect(environment) is expected
