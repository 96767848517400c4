"""Algorithms by name: how workers combine their work.

Adding an algorithm is one module (a subclass of `CollectiveAlgorithm` or `ServerAlgorithm`
with its `name`, `Options` and docstring) and one line in `ALGORITHMS`; the job file's checks,
`shoal algorithms`, the README's table (checked by a test) and the config docs read this list.
Two classes may share a name when an option chooses between them (`variant`): `easgd` is the
collective variant with `synchronous = true` and the parameter server otherwise.
"""

from __future__ import annotations

import dataclasses
import difflib

from shoal.algorithms.averaging import ModelAveraging
from shoal.algorithms.base import Algorithm
from shoal.algorithms.collective import CollectiveAlgorithm, Plain
from shoal.algorithms.downpour import Downpour
from shoal.algorithms.elastic import ElasticAveraging
from shoal.algorithms.elastic_server import AsynchronousElasticAveraging
from shoal.algorithms.roles import Role
from shoal.algorithms.server import ServerAlgorithm
from shoal.algorithms.sync import SynchronousSGD
from shoal.errors import ConfigError

ALGORITHMS: tuple[type[Algorithm], ...] = (
    SynchronousSGD,
    ModelAveraging,
    Downpour,
    ElasticAveraging,
    AsynchronousElasticAveraging,
    Plain,
)

REGISTRY: dict[str, tuple[type[Algorithm], ...]] = {}
for _algorithm in ALGORITHMS:
    REGISTRY[_algorithm.name] = (*REGISTRY.get(_algorithm.name, ()), _algorithm)
    if _algorithm.Options is not REGISTRY[_algorithm.name][0].Options:  # the user's keys pick the variant
        raise TypeError(f"{_algorithm.__name__}: variants of {_algorithm.name!r} must share one Options class")


def registered(name: str) -> tuple[type[Algorithm], ...]:
    """The classes registered under `name`; an unknown name is a config error naming the key."""
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, list(REGISTRY), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"algorithm.name: unknown algorithm {name!r}{hint}; choose one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def options_class(name: str) -> type:
    """The options dataclass of the algorithm `name`."""
    return registered(name)[0].Options


def option_names() -> set[str]:
    """Every option key some algorithm knows."""
    return {field.name for classes in REGISTRY.values() for field in dataclasses.fields(classes[0].Options)}


def refused_elsewhere() -> dict[str, str]:
    """Option keys that an algorithm without them refuses rather than sets aside, with what they are for: left out
    silently they would train another job than the one the file asks for (averaging's outer optimizer)."""
    return {field.name: field.metadata["refused_elsewhere"] for classes in REGISTRY.values()
            for field in dataclasses.fields(classes[0].Options) if "refused_elsewhere" in field.metadata}


def algorithm_class(name: str, options=None) -> type[Algorithm]:
    """The class registered under `name` whose variant matches `options` (default options when None)."""
    options = options if options is not None else options_class(name)()
    for cls in registered(name):
        if all(getattr(options, key) == value for key, value in cls.variant.items()):
            return cls
    raise ConfigError(f"algorithm: no variant of {name!r} for these options")


def make_algorithm(name: str, options: dict, groups: int | str | list[list[int]] = 1) -> Algorithm:
    """The algorithm `name` with its options; `groups` is cluster.groups (hierarchical algorithms): a count, the
    members of each group, or "machine" where the machines are not known yet (checked as one group)."""
    typed = options_class(name)(**options)
    cls = algorithm_class(name, typed)
    if groups == "machine":
        if issubclass(cls, ServerAlgorithm) or not cls.supports_groups:  # sub-masters are ranks 1..G, not machines
            raise ConfigError(f'cluster.groups: "machine" groups are for averaging and synchronous EASGD, not {name}')
        groups = 1
    return cls(typed, groups)


def role(algorithm: Algorithm, rank: int, world_size: int) -> Role:
    """What `rank` does under `algorithm`: every rank trains unless a server takes some."""
    if isinstance(algorithm, ServerAlgorithm):
        return algorithm.role(rank, world_size)
    return Role.TRAINER


def trainer_ranks(algorithm: Algorithm, world_size: int) -> list[int]:
    """The ranks that train: all of them unless a server takes some."""
    if isinstance(algorithm, ServerAlgorithm):
        return algorithm.trainer_ranks(world_size)
    return list(range(world_size))


def catalogue() -> list[tuple[str, str, str]]:
    """(name, variant, summary) of every registered class, in registry order: `shoal algorithms`."""
    rows = []
    for cls in ALGORITHMS:
        variant = ", ".join(f"{key} = {str(value).lower()}" for key, value in cls.variant.items())
        family = "parameter server" if issubclass(cls, ServerAlgorithm) else "collective"
        groups = "; groups" if cls.supports_groups else ""
        rows.append((cls.name, variant, f"{cls.summary()} ({family}{groups})"))
    return rows


__all__ = ["ALGORITHMS", "Algorithm", "CollectiveAlgorithm", "REGISTRY", "Role", "ServerAlgorithm",
           "algorithm_class", "catalogue", "make_algorithm", "option_names", "options_class",
           "refused_elsewhere", "role", "trainer_ranks"]
