"""cluster.groups = "machine": each machine's workers one group, for the algorithms that have groups."""

from __future__ import annotations

import pytest

from shoal.algorithms import make_algorithm
from shoal.algorithms.groups import machine_groups
from shoal.config import ClusterConfig
from shoal.errors import ConfigError


def test_each_machines_ranks_are_one_group_in_the_order_of_their_first_rank():
    assert machine_groups(["a", "a", "b"]) == [[0, 1], [2]]
    assert machine_groups(["b", "a", "a", "c"]) == [[0], [1, 2], [3]]
    assert machine_groups(["a"]) == [[0]]


def test_given_members_are_the_groups_of_averaging_and_synchronous_easgd():
    averaging = make_algorithm("averaging", {"period": 4, "group_period": 2}, [[0, 1], [2]])
    assert averaging.groups == 2 and averaging.group_layout(3) == [[0, 1], [2]]
    easgd = make_algorithm("easgd", {"synchronous": True, "group_period": 2, "period": 4}, [[0], [1, 2]])
    assert easgd.group_layout(3) == [[0], [1, 2]]


def test_before_the_machines_are_known_machine_groups_are_checked_as_one_group():
    assert make_algorithm("averaging", {}, "machine").groups == 1


@pytest.mark.parametrize("name, options", [("downpour", {}), ("easgd", {"synchronous": False}), ("sync", {}),
                                           ("none", {})])
def test_algorithms_without_machine_groups_refuse_them_in_one_line(name, options):
    with pytest.raises(ConfigError, match=r"^cluster\.groups: ") as refused:
        make_algorithm(name, options, "machine")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("groups", ["rack", 0, True, 1.5])
def test_groups_are_a_count_or_machine(groups):
    with pytest.raises(ConfigError, match=r'^cluster\.groups: must be an integer >= 1 or "machine"'):
        ClusterConfig(groups=groups)
