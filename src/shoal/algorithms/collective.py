"""Collective algorithms: every rank trains, and the ranks meet in collectives.

Synchronous SGD, model averaging and synchronous EASGD exchange through all-reduces that every
rank enters at the same step, so no rank has a role of its own and the runner trains on all of
them. Their whole interface is `Algorithm`'s trainer hooks.
"""

from __future__ import annotations

from shoal.algorithms.base import Algorithm
from shoal.errors import ConfigError


class CollectiveAlgorithm(Algorithm):
    """An algorithm whose every rank trains; exchanges are collectives entered at the same step."""


class Plain(CollectiveAlgorithm):
    """No communication: one worker training alone."""

    name = "none"

    def check(self, world_size: int) -> None:
        super().check(world_size)
        if world_size > 1:
            raise ConfigError(f"algorithm.name: 'none' trains without communication; with {world_size} workers "
                              "all but one would train for nothing: use 'sync' or 'averaging'")
