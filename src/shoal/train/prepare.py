"""Everything a job needs that can be checked before any worker starts.

The launcher calls `prepare` so that a bad dataset path, a model that does not fit the data
or a bad optimizer setting fails at once with a one-line error; every worker calls it again
to build the same pieces.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import math
import sys
from dataclasses import dataclass

import torch

from shoal.algorithms import Algorithm, make_algorithm, trainer_ranks
from shoal.config import JobConfig
from shoal.data.format import Dataset, open_dataset
from shoal.data.loader import plan_memory
from shoal.errors import ConfigError, DataError
from shoal.model import build_model, output_shape
from shoal.train.objective import Objective


@dataclass
class Prepared:
    train_set: Dataset
    test_set: Dataset | None
    spec: dict
    objective: Objective


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    optimizers = {
        cls.__name__.lower(): cls
        for cls in vars(torch.optim).values()
        if inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer
    }
    if name.lower() not in optimizers:
        close = difflib.get_close_matches(name.lower(), list(optimizers), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"train.optimizer.name: unknown optimizer {name!r}{hint}")
    return optimizers[name.lower()]


def make_optimizer(options: dict, parameters) -> torch.optim.Optimizer:
    """A torch optimizer from {name = ..., other keyword arguments}; bad arguments name the key."""
    arguments = {k: v for k, v in options.items() if k != "name"}
    cls = optimizer_class(options["name"])
    accepted = inspect.signature(cls.__init__).parameters
    for key in arguments:
        if key not in accepted or key in ("self", "params"):
            raise ConfigError(f"train.optimizer.{key}: not an argument of torch.optim.{cls.__name__}")
    try:
        return cls(parameters, **arguments)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"train.optimizer: {error}") from None


def check_optimizer(options: dict, parameters) -> None:
    """Build the optimizer once to check its settings, without importing torch's compiler.

    torch wraps `Optimizer.add_param_group` so that its compiler skips it, and imports the compiler
    (2 s, a third of a small job's start) on the first call to do so. Nothing is compiled while
    a job is checked, so the wrapper's work may be skipped; the training optimizer is built as usual.
    """
    with _compiler_unimported():
        make_optimizer(options, parameters)


@contextlib.contextmanager
def _compiler_unimported():
    original = getattr(torch.optim.Optimizer.add_param_group, "__wrapped__", None)
    if original is None or "torch._dynamo" in sys.modules or hasattr(original, "__dynamo_disable"):
        yield  # another torch, or the compiler already there: nothing to save
        return
    original.__dynamo_disable = original  # what torch's wrapper caches once the compiler is imported
    try:
        yield
    finally:
        if getattr(original, "__dynamo_disable", None) is original:
            del original.__dynamo_disable


def model_spec(job: JobConfig, train_set: Dataset) -> dict:
    input_shape = list(job.model.input or train_set.shape)
    if math.prod(input_shape) != train_set.features:
        raise ConfigError(
            f"model.input: {input_shape} holds {math.prod(input_shape)} values, but data.train "
            f"({train_set.path}) has {train_set.features} features per row"
        )
    if job.model.factory:
        return {"input": input_shape, "factory": job.model.factory, "arguments": job.model.arguments}
    return {"input": input_shape, "layers": job.model.layers}


def check_world_size(job: JobConfig, world_size: int, train_set: Dataset, algorithm: Algorithm | None = None) -> None:
    """Settings that make no sense for this many workers: the algorithm's own check, then the rows.

    The launcher calls it before any worker starts; each worker calls it again with the algorithm it
    built (a worker started by torchrun or srun has no launcher of shoal's before it).
    """
    if algorithm is None:
        algorithm = make_algorithm(job.algorithm.name, job.algorithm.options, job.cluster.groups)
    algorithm.check(world_size)
    trainers = len(trainer_ranks(algorithm, world_size))
    if train_set.rows < trainers:
        raise ConfigError(f"data.train: {train_set.path} has {train_set.rows:,} rows, fewer than the {trainers} "
                          "training workers")
    largest = -(-train_set.rows // trainers)
    plan_memory(largest, train_set.features * train_set.feature_dtype.itemsize, job.train.batch_size,
                job.data.memory_budget)


def prepare(job: JobConfig) -> Prepared:
    """Open the datasets, build the model once and check that it fits them."""
    train_set = open_dataset(job.data.train)
    test_set = open_dataset(job.data.test) if job.data.test else None
    if test_set is not None and test_set.schema_key() != train_set.schema_key():
        raise DataError(
            f"{test_set.path}: test set does not match the training set {train_set.path} "
            f"(shape, dtype and classes must agree: {test_set.schema_key()} vs {train_set.schema_key()})"
        )
    spec = model_spec(job, train_set)
    objective = Objective(job.train.loss, train_set.num_classes)
    model = build_model(spec)
    shape = output_shape(model, spec["input"])
    expected = objective.expected_outputs()
    if shape != (expected,):
        what = f"{train_set.num_classes} classes" if train_set.num_classes else "a numeric label"
        raise ConfigError(
            f"model.layers: the model gives outputs of shape {list(shape)}, but data.train has {what}: "
            f"loss {job.train.loss} needs {expected} output(s) per row"
        )
    check_optimizer(job.train.optimizer, model.parameters())
    return Prepared(train_set, test_set, spec, objective)
