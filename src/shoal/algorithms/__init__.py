"""Algorithms by name: how workers combine their work."""

from __future__ import annotations

import difflib

from shoal.algorithms.averaging import ModelAveraging
from shoal.algorithms.base import Algorithm, Plain
from shoal.algorithms.downpour import Downpour
from shoal.algorithms.elastic import ElasticAveraging
from shoal.algorithms.sync import SynchronousSGD
from shoal.errors import ConfigError

REGISTRY: dict[str, type[Algorithm]] = {
    "none": Plain,
    "sync": SynchronousSGD,
    "averaging": ModelAveraging,
    "downpour": Downpour,
    "easgd": ElasticAveraging,
}


def algorithm_class(name: str) -> type[Algorithm]:
    """The class registered under `name`; an unknown name is a config error naming the key."""
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, list(REGISTRY), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"algorithm.name: unknown algorithm {name!r}{hint}; choose one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def make_algorithm(name: str, options: dict, groups: int = 1) -> Algorithm:
    """The algorithm `name` with its options; `groups` is cluster.groups (hierarchical algorithms)."""
    cls = algorithm_class(name)
    return cls.build(cls.Options(**options), groups)


__all__ = ["Algorithm", "REGISTRY", "algorithm_class", "make_algorithm"]
