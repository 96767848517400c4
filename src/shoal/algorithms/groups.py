"""Hierarchical groups and periods: the checks and the rank layout that several algorithms share.

Averaging, synchronous EASGD and Downpour split their workers into contiguous groups of nearly
equal size (cluster.groups; averaging and synchronous EASGD also one group per machine) and count
rounds in periods of steps; the rules for both live here
so that each algorithm states them the same way and none imports another.
"""

from __future__ import annotations

from shoal.errors import ConfigError


def is_step_count(value) -> bool:
    """An integer >= 1 (a TOML `true` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_period(key: str, period) -> None:
    """A period is "epoch" or a number of steps >= 1."""
    if period != "epoch" and not is_step_count(period):
        raise ConfigError(f"{key}: must be \"epoch\" or a number of steps >= 1, got {period!r}")


def check_group_period(group_period, period) -> None:
    """`group_period`: unset, or a number of steps >= 1 below a step `period`."""
    if group_period is None:
        return
    if not is_step_count(group_period):
        raise ConfigError(f"algorithm.group_period: must be a number of steps >= 1, got {group_period!r}")
    if period != "epoch" and group_period >= period:
        raise ConfigError(f"algorithm.group_period: must be smaller than algorithm.period ({period}), or no "
                          f"round within a group comes between two rounds across groups; got {group_period}")


def check_groups(groups: int, group_period, trainers: int) -> None:
    """Refuse more groups than trainers, and groups without rounds of their own."""
    if groups > trainers:
        raise ConfigError(f"cluster.groups: {groups} groups need at least {groups} training workers, got {trainers}")
    if groups > 1 and group_period is None:
        raise ConfigError(f"algorithm.group_period: required with cluster.groups = {groups}: "
                          "the steps between rounds within a group")


def contiguous_groups(count: int, groups: int) -> list[list[int]]:
    """Ranks 0..count-1 in `groups` contiguous groups whose sizes differ by at most one (larger first)."""
    base, extra = divmod(count, groups)
    members, start = [], 0
    for group in range(groups):
        size = base + (1 if group < extra else 0)
        members.append(list(range(start, start + size)))
        start += size
    return members


def machine_groups(hosts: list[str]) -> list[list[int]]:
    """cluster.groups = "machine": the ranks of each host (rank i runs on hosts[i]), hosts in order of first rank."""
    members: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        members.setdefault(host, []).append(rank)
    return list(members.values())
