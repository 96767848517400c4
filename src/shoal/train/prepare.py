"""Everything a job needs that can be checked before any worker starts.

The launcher calls `prepare` so that a bad dataset path, a model that does not fit the data
or this machine's memory, a bad optimizer setting or the user's code that does not load fails at
once with a one-line error; every worker calls it again to build the same pieces.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil
import torch

from shoal.algorithms import Algorithm, Role, make_algorithm, role, trainer_ranks
from shoal.code import current_folder_importable
from shoal.config import JobConfig, TrainConfig
from shoal.data.balance import check_speeds
from shoal.data.compatible import TRAINING, check_compatible, schema
from shoal.data.format import Dataset
from shoal.data.holdout import TrainingRows, held_out_rows
from shoal.data.loader import plan_memory
from shoal.data.source import open_source
from shoal.errors import ConfigError, first_line
from shoal.model import build_model, code_of, object_key, output_shape
from shoal.train.objective import Objective, metric_names
from shoal.train.schedule import make_schedule
from shoal.train.step import Step, load_step
from shoal.train.stopping import stop_rule
from shoal.train.transform import load_transform
from shoal.train.uncompiled import without_compiler
from shoal.train.user_metrics import job_metrics

UNUSABLE_OPTIMIZERS = {
    "lbfgs": "LBFGS needs a closure that recomputes the loss at every step, and shoal takes one plain step "
             "per batch",
    "sparseadam": "SparseAdam needs sparse gradients, and shoal's models give dense ones",
}
"""torch optimizers that shoal's training loop cannot drive, with the reason."""
ACCUMULATING = ("sync", "none")
"""The algorithms whose every step is one gradient exchange (or none), which train.accumulate merges."""
TRAINING_COPIES = 4
"""Bytes of training state per byte of parameters: the weights, their gradients and the two moments
of an Adam-like optimizer."""
ALLOCATION_FAILURES = ("not enough memory", "out of memory", "allocate memory", "tried to allocate",
                       "failed to allocate")
"""What torch's allocators say, in lowercase, when memory runs out."""


@dataclass
class Prepared:
    train_set: Dataset
    """The rows trained on (without the held-out ones, with train.validation_split)."""
    test_set: Dataset | None
    spec: dict
    objective: Objective
    step: Step | None = None
    """The user's training step, if any."""
    transform: Callable | None = None
    """The user's batch transform, if any."""
    evaluate_by_step: bool = False
    """The test set is evaluated by the user's step (its loss and logged numbers) rather than the loss's."""
    held_out: np.ndarray | None = None
    """With train.validation_split: the rows of `source` held out for validation."""
    source: Dataset | None = None
    """The training dataset as stored, held-out rows included."""

    @property
    def evaluation_step(self) -> Step | None:
        """The user's step where it evaluates held rows (shoal cannot read the model's outputs), else None."""
        return self.step if self.evaluate_by_step else None


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    if name.lower() in UNUSABLE_OPTIMIZERS:
        raise ConfigError(f"train.optimizer.name: {name!r} cannot be used: {UNUSABLE_OPTIMIZERS[name.lower()]}")
    optimizers = {
        cls.__name__.lower(): cls
        for cls in vars(torch.optim).values()
        if inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer
        and cls.__name__.lower() not in UNUSABLE_OPTIMIZERS
    }
    if name.lower() not in optimizers:
        close = difflib.get_close_matches(name.lower(), list(optimizers), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"train.optimizer.name: unknown optimizer {name!r}{hint}")
    return optimizers[name.lower()]


def make_optimizer(options: dict, parameters) -> torch.optim.Optimizer:
    """A torch optimizer from {name = ..., other keyword arguments, param_groups = [...]}; bad arguments name
    the key. `parameters` is the model (an nn.Module), or its parameters where no `param_groups` are given:
    groups pick parameters by name, which only the model knows."""
    cls = optimizer_class(options["name"])
    accepted = inspect.signature(cls.__init__).parameters
    arguments = {key: value for key, value in options.items() if key not in ("name", "param_groups")}
    check_arguments("train.optimizer", arguments, cls, accepted)
    if options.get("param_groups") is not None:
        if not isinstance(parameters, torch.nn.Module):
            raise ConfigError("train.optimizer.param_groups: picks parameters by name, so the optimizer must be "
                              "built on the model (an nn.Module), not on a list of its parameters")
        parameters = parameter_groups(options["param_groups"], parameters, cls, accepted, arguments)
    elif isinstance(parameters, torch.nn.Module):
        parameters = parameters.parameters()
    try:
        return cls(parameters, **arguments)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"train.optimizer: {error}") from None


def check_arguments(key: str, arguments: dict, cls: type, accepted) -> None:
    """Each of `arguments` is an argument of the optimizer `cls`, of the kind its default is."""
    for name, value in arguments.items():
        if name not in accepted or name in ("self", "params"):
            raise ConfigError(f"{key}.{name}: not an argument of torch.optim.{cls.__name__}")
        check_argument_type(f"{key}.{name}", value, accepted[name].default)


def parameter_groups(groups, model: torch.nn.Module, cls: type, accepted, arguments: dict) -> list[dict]:
    """torch's param groups for `train.optimizer.param_groups`: each listed group (in order) takes the parameters
    whose names its `params` pattern finds (re.search) and no earlier group took; the parameters left form the
    last group, with the top-level settings (left out when none is left). The same model and job give the same
    groups in the same order, so a checkpoint's optimizer state loads back."""
    if not (isinstance(groups, list) and all(isinstance(group, dict) for group in groups)):
        raise ConfigError("train.optimizer.param_groups: expected a list of tables, e.g. "
                          f"[{{ params = \"bias$\", weight_decay = 0.0 }}], got {groups!r}")
    named = list(model.named_parameters())
    names = [name for name, _ in named]
    taken: set[str] = set()
    built = []
    for index, group in enumerate(groups):
        key = f"train.optimizer.param_groups[{index}]"
        pattern = group_pattern(key, group.get("params"))
        settings = {name: value for name, value in group.items() if name != "params"}
        check_arguments(key, settings, cls, accepted)
        matched = [name for name in names if pattern.search(name)]
        if not matched:
            raise ConfigError(f"{key}.params: {pattern.pattern!r} matches none of the model's parameters "
                              f"({some_names(names)})")
        mine = {name for name in matched if name not in taken}
        if not mine:
            raise ConfigError(f"{key}.params: every parameter {pattern.pattern!r} matches ({some_names(matched)}) "
                              "is in an earlier group: a parameter joins the first group that matches it")
        taken.update(mine)
        members = [parameter for name, parameter in named if name in mine]
        check_group_values(key, cls, {**arguments, **settings}, members[0])
        built.append({"params": members, **settings})
    rest = [parameter for name, parameter in named if name not in taken]
    return built + [{"params": rest}] if rest else built


def group_pattern(key: str, params) -> re.Pattern:
    """A group's `params`: a regular expression searched in the parameters' names."""
    if not isinstance(params, str):
        raise ConfigError(f"{key}.params: required: a regular expression searched in the parameters' names "
                          f"(e.g. \"bias$\" or \"^0\\\\.\"), got {params!r}")
    try:
        return re.compile(params)
    except re.error as error:
        raise ConfigError(f"{key}.params: {params!r} is not a regular expression: {error}") from None


def check_group_values(key: str, cls: type, settings: dict, like: torch.Tensor) -> None:
    """torch checks the values given to an optimizer's constructor (a negative rate...), not a group's: a group's
    settings are checked by building the optimizer with them on one stand-in parameter."""
    try:
        cls([torch.zeros(1, dtype=like.dtype, device=like.device, requires_grad=True)], **settings)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ConfigError(f"{key}: {first_line(error)}") from None


def some_names(names: list[str], shown: int = 6) -> str:
    """The first few of `names`, for a message."""
    more = f", ... ({len(names)} in all)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more if names else "it has none"


def check_argument_type(key: str, value: Any, default: Any) -> None:
    """A value of the kind the argument's default is, so that torch's own checks do not fail on a type
    ("'<=' not supported between ..."): a number for a number, a list of numbers for a tuple, true/false."""
    def number(item: Any) -> bool:
        return isinstance(item, (int, float)) and not isinstance(item, bool)

    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
    elif number(default):
        if not number(value):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
    elif isinstance(default, tuple) and all(number(item) for item in default):
        if not (isinstance(value, (list, tuple)) and len(value) == len(default) and all(map(number, value))):
            example = ", ".join(str(item) for item in default)
            raise ConfigError(f"{key}: expected a list of {len(default)} numbers, e.g. [{example}], got {value!r}")


def check_optimizer(options: dict, parameters) -> torch.optim.Optimizer:
    """Build the optimizer once to check its settings, without importing torch's compiler (see
    `shoal.train.uncompiled`), and give it back (the scheduler's check builds on it); the training
    optimizer is built as usual."""
    return without_compiler(lambda: make_optimizer(options, parameters))


def model_spec(job: JobConfig, train_set: Dataset) -> dict:
    input_shape = list(job.model.input or train_set.shape)
    if math.prod(input_shape) != train_set.features:
        raise ConfigError(
            f"model.input: {input_shape} holds {math.prod(input_shape)} values, but data.train "
            f"({train_set.path}) has {train_set.features} features per row"
        )
    if job.model.factory:
        return {"input": input_shape, "factory": job.model.factory, "arguments": job.model.arguments}
    if job.model.object:
        return {"input": input_shape, "object": job.model.object}
    return {"input": input_shape, "layers": job.model.layers}


def model_key(spec: dict) -> str:
    """The job key that describes the model (for the model shoal.fit shipped, its argument `model`)."""
    if spec.get("object"):
        return object_key(spec["object"])
    code = code_of(spec)
    return code[0] if code else "model.layers"


def estimate_model(spec: dict) -> torch.nn.Module | None:
    """The model built on torch's meta device: every shape, no memory. None for a factory that only
    works on real tensors (its real build then says what is wrong, if anything), or a model shipped whole."""
    if spec.get("object"):
        return None  # its weights exist already: the real build is the check
    if spec.get("factory"):
        try:
            _import_factory_module(spec["factory"])
            return built_on_meta(spec)
        except Exception:  # the user's code may need real tensors
            return None
    try:
        return built_on_meta(spec)
    except (RuntimeError, TypeError, ValueError, OverflowError) as error:
        # layer values are checked before torch sees them: what torch refuses is a size past its limits
        raise ConfigError(f"model.layers: too large to build: {first_line(error)}") from None


def built_on_meta(spec: dict) -> torch.nn.Module:
    """The model on torch's meta device, its meta kernels run without importing torch's compiler."""
    def build() -> torch.nn.Module:
        with torch.device("meta"):
            return build_model(spec)

    return without_compiler(build)


def _import_factory_module(factory: str) -> None:
    """Import the factory's module off the meta device, so that tensors it makes on import stay real."""
    with current_folder_importable():  # where model.from_factory looks too
        importlib.import_module(factory.partition(":")[0])


def training_bytes(model: torch.nn.Module) -> int:
    """Memory that training the model takes: its parameters' training state and its buffers."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return TRAINING_COPIES * weights + buffers


def check_model_size(spec: dict, available: int | None = None) -> None:
    """Refuse, before allocating it, a model whose training state exceeds this machine's available memory."""
    model = estimate_model(spec)
    if model is None:
        return
    needed = training_bytes(model)
    available = psutil.virtual_memory().available if available is None else available
    if needed > available:
        count = sum(p.numel() for p in model.parameters())
        raise ConfigError(
            f"{model_key(spec)}: the model has {count:,} parameters and takes about {needed / 2**30:,.1f} GiB "
            f"to train (weights, gradients, optimizer state), more than the {available / 2**30:,.1f} GiB "
            "this machine has available"
        )


def allocate_model(spec: dict, run_dir=None) -> torch.nn.Module:
    """The real model (a shipped one read from `run_dir`); running out of memory while building it is a
    one-line error naming the model's key."""
    try:
        return build_model(spec, run_dir)
    except MemoryError:
        reason = "out of memory"
    except RuntimeError as error:
        if not any(text in str(error).lower() for text in ALLOCATION_FAILURES):
            raise
        reason = first_line(error)
    raise ConfigError(f"{model_key(spec)}: not enough memory to build the model: {reason}")


def check_custom_loss(objective: Objective, model: torch.nn.Module, input_shape: list[int]) -> None:
    """The user's loss on two rows of the model's outputs: a loss that cannot take them fails here, in one line."""
    outputs = model(torch.zeros(2, *input_shape))
    labels = torch.zeros(2, dtype=objective.label_dtype)
    try:
        value = objective(outputs, labels)
    except ConfigError:
        raise
    except Exception as error:
        raise ConfigError(f"train.loss: {objective.loss!r} fails on the model's outputs {list(outputs.shape)}: "
                          f"{type(error).__name__}: {first_line(error)}") from None
    if not (isinstance(value, torch.Tensor) and value.numel() == 1):
        raise ConfigError(f"train.loss: {objective.loss!r} must return one number, got {type(value).__name__}")


def check_schedule(job: JobConfig, run_dir=None, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Build the scheduler on `optimizer` (the job's, built once to check it and thrown away after; else a
    stand-in); a `train.scheduler.factory` shipped by value is read from `run_dir`. Where a server applies the
    updates, a per-step schedule and clipping are refused: the trainers' optimizer takes no step, and the
    server's steps when updates come. Accumulation merges exchanges, so it goes with the algorithms that exchange
    at every step."""
    algorithm = make_algorithm(job.algorithm.name, job.algorithm.options, job.cluster.groups)
    server = role(algorithm, 0, world_size=2) is Role.SERVER  # rank 0 serves in any world a server runs in
    if job.train.accumulate is not None and job.algorithm.name not in ACCUMULATING:
        raise ConfigError(f"train.accumulate: sums gradients before one exchange, which {job.algorithm.name} does "
                          f"not make every step; use it with {' or '.join(ACCUMULATING)}")
    if server and job.train.clip_norm is not None:
        raise ConfigError(f"train.clip_norm: {job.algorithm.name} sends the trainers' gradients to its server "
                          "unclipped; clipping is for the collective algorithms")
    if job.train.scheduler is None:
        return
    if optimizer is None:
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    schedule = without_compiler(lambda: make_schedule(job.train.scheduler, optimizer, run_dir))
    if schedule.interval == "step" and server:
        raise ConfigError(f"train.scheduler: {job.algorithm.name} applies updates on its server, whose optimizer "
                          "steps when updates arrive: use a schedule stepped per epoch (interval = \"epoch\")")


def check_device(job: JobConfig) -> None:
    """cluster.device = "cuda" on a machine without one fails here, once, before any worker starts (each
    worker would fail alike). torch's count asks NVML where it can, which leaves a fork of this process
    free to use the GPU."""
    if job.cluster.device == "cuda" and torch.cuda.device_count() == 0:
        raise ConfigError("cluster.device: 'cuda' asked for but this machine has no CUDA device that torch "
                          "can use: set it to \"cpu\" or \"auto\"")


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
    check_speeds(job.cluster.balance, trainers)
    largest = -(-train_set.rows // trainers)
    row_bytes = train_set.features * train_set.feature_dtype.itemsize
    plan_memory(largest, row_bytes, job.train.batch_size, job.data.memory_budget)
    if job.cluster.balance != "equal" and trainers > 1:  # where all take the same steps, batches grow with shares
        batch = trainers * job.train.batch_size if algorithm.same_steps() else job.train.batch_size
        check_moved_share(job, train_set.rows, row_bytes, batch)


def check_moved_share(job: JobConfig, rows: int, row_bytes: int, batch: int) -> None:
    """Shares sized by speed may give one worker nearly every row (and, where all take the same steps, nearly
    the global batch): the memory budget must hold that share's labels and sub-partitions, or a job would
    fail at an epoch's end when its shares move."""
    try:
        plan_memory(rows, row_bytes, batch, job.data.memory_budget)
    except ConfigError as error:
        raise ConfigError(f"cluster.balance: {job.cluster.balance!r} may give one worker up to all {rows:,} rows, "
                          f"and {first_line(error)}") from None


def prepare(job: JobConfig, memory_checked: bool = False, run_dir=None) -> Prepared:
    """Open the datasets, build the model once and check that it fits them; `memory_checked`: this machine's
    launcher has checked the model's memory already (on torch's meta device, half a second of imports)."""
    train_set = open_source(job.data.train)  # here, or from the job's data server on a machine without it
    test_set = open_source(job.data.test) if job.data.test else None
    for key, dataset in (("data.train", train_set), ("data.test", test_set)):
        if dataset is not None and not dataset.labeled:
            raise ConfigError(f"{key}: {dataset.path} has no labels (imported without one): it can be predicted "
                              "with `shoal predict`, not trained or tested on")
    if test_set is not None:
        check_compatible(test_set, schema(train_set), f"the training set {train_set.path}", TRAINING)
    spec = model_spec(job, train_set)
    objective = Objective(loss_of(job, train_set), train_set.num_classes, run_dir)
    step = load_step(job.train.step, run_dir)  # the user's code, from the run directory where fit wrote it
    transform = load_transform(job.data.transform, run_dir)
    if not memory_checked:
        check_model_size(spec)
    model = allocate_model(spec, run_dir)  # a shipped model is read from the run directory
    by_step = check_outputs(job, spec, objective, model, train_set, step)
    optimizer = check_optimizer(job.train.optimizer, model)
    check_schedule(job, run_dir, optimizer)
    metrics = job_metrics(job, run_dir, test_set is not None, by_step)
    check_evaluation(job, by_step, test_set is not None, metric_names(objective), metrics.names)
    held_out = held_out_rows(train_set.rows, job.train.validation_split, job.train.seed) \
        if job.train.validation_split else None
    training = TrainingRows(train_set, held_out) if held_out is not None else train_set
    return Prepared(training, test_set, spec, objective, step=step, transform=transform, evaluate_by_step=by_step,
                    held_out=held_out, source=train_set)


def loss_of(job: JobConfig, train_set: Dataset) -> str:
    """The loss that reads the model's outputs: the job's; with a step of the user's own (which computes the
    training loss itself) on a numeric label, the default (class logits) gives way to mse."""
    if job.train.step and train_set.num_classes is None and job.train.loss == TrainConfig.loss:
        return "mse"
    return job.train.loss


def check_evaluation(job: JobConfig, by_step: bool, test_set: bool, built_in: tuple[str, ...],
                     user: tuple[str, ...]) -> None:
    """train.stop names a metric some epoch will have (`built_in`: the loss's metrics, which the held-out rows
    are measured by too; `user`: the job's own test metrics); background validation does not run the user's
    step (it would draw from the training's random numbers, in another thread)."""
    if by_step and (job.train.validate_every or job.train.validate_seconds):
        key = "train.validate_every" if job.train.validate_every else "train.validate_seconds"
        raise ConfigError(f"{key}: the test set is evaluated by train.step, which background validation would run "
                          "beside training (in another thread, drawing from its random numbers): use "
                          "train.eval_every")
    rule = stop_rule(job.train.stop)
    if rule is None:
        return
    prefix, _, name = rule.metric.partition("_")
    known = {"train_": name == "loss" or job.train.step is not None,  # a step logs names of its own
             "test_": test_set and (by_step or name in (*built_in, *user)),
             "validation_": bool(job.train.validation_split) and (by_step or name in built_in)}
    if not known.get(f"{prefix}_", False):
        measured = ["train_loss", *(f"test_{name}" for name in (*built_in, *user) if test_set),
                    *(f"validation_{name}" for name in built_in if job.train.validation_split)]
        raise ConfigError(f"train.stop.metric: {rule.metric!r} is not a metric this job measures: "
                          f"{', '.join(measured)}{' or train_<what your step logs>' if job.train.step else ''}")


def check_outputs(job: JobConfig, spec: dict, objective: Objective, model: torch.nn.Module, train_set: Dataset,
                  step: Step | None) -> bool:
    """Whether the model's outputs fit the loss and labels (or, with a step of the user's own, need not); True
    when the test set is evaluated by that step (rows of fields, or outputs shoal cannot read itself)."""
    if train_set.fields:
        if step is None:
            names = ", ".join(field["name"] for field in train_set.fields)
            raise ConfigError(f"data.train: {train_set.path} holds rows of named fields ({names}): give a training "
                              "step that feeds them to the model: train.step (shoal.fit(step=...))")
        return True
    try:
        shape = output_shape(model, spec["input"])
    except ConfigError:
        if step is None:
            raise
        return True  # the step knows what the model takes and gives
    if objective.accepts(shape):
        if objective.custom:
            check_custom_loss(objective, model, spec["input"])
        return False
    if step is not None:
        return True
    what = f"{train_set.num_classes} classes" if train_set.num_classes else "a numeric label"
    raise ConfigError(f"{model_key(spec)}: the model gives outputs of shape {list(shape)}, but data.train has {what}: "
                      f"loss {job.train.loss} needs {objective.expected_outputs()} output(s) per row")
