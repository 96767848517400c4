"""Job files: TOML in, typed and validated dataclasses out.

A job file has the sections model, data, algorithm, train, cluster and output. Every key is
checked here, before any process starts, and a problem is reported as one line that names the
file and the key (`job.toml: train.epochs: must be an integer >= 1, got 0`). Any key can be
overridden with `section.key=value`, the value written as in TOML.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import tomli_w

from shoal.code import check_reference, is_reference
from shoal.errors import ConfigError

PROGRESS_MODES = ("auto", "bar", "lines", "none")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")
LOSSES = ("cross_entropy", "binary_cross_entropy", "mse")
LOGGERS = ("csv", "mlflow", "tensorboard")
BALANCES = ("equal", "speed")
GROUP_BY_MACHINE = "machine"
DEFAULT_PORT = 29400
"""Where the machines meet on the first one, unless told (torchrun's default too)."""
SEED_LIMIT = 2**63
"""train.seed is below this: TOML integers are signed 64-bit, and each rank seeds torch with
seed + 1 + rank, which torch takes up to 2**64 - 1."""
MAX_THREADS = 1024
"""cluster.threads at most: more than the hardware threads of today's largest two-socket machines
(768); far more makes OpenMP start threads until the worker crashes (10**8 ends in SIGSEGV)."""
TIMEOUT_RANGE = (1.0, 7 * 24 * 3600.0)
"""cluster.timeout in seconds: workers need more than a second to meet at all, and a collective
silent for over a week is stuck; the upper bound also keeps far inside timedelta and the store's clocks."""
STALL_RANGE = (5.0, 7 * 24 * 3600.0)
"""cluster.stall_timeout in seconds: workers beat every second, and a beat may come a few seconds late on a
loaded machine, so a worker is not called hung before five beats are missed."""


@dataclass
class ModelConfig:
    input: list[int] | None = None
    """Shape of one sample, e.g. [123] or [28, 28]; defaults to the training set's sample shape."""
    layers: list[dict] | None = None
    """Layer list, e.g. [{dense = 100, activation = "relu"}, {dropout = 0.5}, {dense = 2}]."""
    factory: str | None = None
    """Instead of layers: "package.module:function" returning a torch.nn.Module."""
    arguments: dict = field(default_factory=dict)
    """Keyword arguments passed to the factory."""
    object: str | None = None
    """Instead of layers or a factory: a file holding a model shipped by value (`shoal.fit(model=...)` writes
    it from an nn.Module or a zero-argument callable); loading it runs code, as a factory does."""

    def __post_init__(self) -> None:
        if sum(value is not None for value in (self.layers, self.factory, self.object)) != 1:
            raise ConfigError("model: give exactly one of 'model.layers', 'model.factory' and 'model.object'")
        if self.input is not None and (not self.input or any(not isinstance(s, int) or s < 1 for s in self.input)):
            raise ConfigError(f"model.input: must be a list of positive integers, got {self.input}")
        if self.factory is not None and ":" not in self.factory:
            raise ConfigError(f"model.factory: must look like 'package.module:function', got {self.factory!r}")


@dataclass
class DataConfig:
    train: str = ""
    """Training dataset folder (or URI), as written by 'shoal data import'."""
    test: str | None = None
    """Held-out dataset evaluated by the coordinator; same sample shape and classes as train."""
    memory_per_worker: int | str | None = None
    """Memory a worker may hold its share in (bytes, or "512MB", "2GiB"); a larger share is
    cached on local disk and trained on in sub-partitions that fit. Default: no limit."""
    cache_dir: str | None = None
    """Local folder that keeps the cached shares, reused by later runs on the unchanged dataset."""
    transform: str | None = None
    """"package.module:function" applied to every training batch on its worker, every epoch (random
    augmentation): it takes the batch as the data yields it and returns it changed; seeded by the job's seed,
    the worker and the step, so a resumed job sees the same draws."""

    def __post_init__(self) -> None:
        if not self.train:
            raise ConfigError("data.train: required: the training dataset folder")
        if self.transform is not None:
            check_reference("data.transform", self.transform)
        if self.memory_per_worker is not None:
            parse_size("data.memory_per_worker", self.memory_per_worker)

    @property
    def memory_budget(self) -> int | None:
        """`memory_per_worker` in bytes."""
        return None if self.memory_per_worker is None else parse_size("data.memory_per_worker", self.memory_per_worker)


@dataclass
class AlgorithmConfig:
    name: str = "sync"
    """How workers combine their work: a name registered in shoal.algorithms (`shoal algorithms` lists them)."""
    options: dict = field(default_factory=dict)
    """The algorithm's own keys (e.g. period), validated by the algorithm."""


@dataclass
class TrainConfig:
    epochs: int = 1
    """Passes over the training set."""
    batch_size: int = 32
    """Rows per step on each worker."""
    optimizer: dict = field(default_factory=lambda: {"name": "sgd", "lr": 0.01})
    """A torch.optim optimizer by lowercase name, with its keyword arguments."""
    loss: str = "cross_entropy"
    """cross_entropy (class logits), binary_cross_entropy (one logit), mse, a torch.nn loss class by name
    ("SmoothL1Loss", "NLLLoss", ...) or "package.module:function" taking (outputs, labels)."""
    step: str | None = None
    """Your own training step, "package.module:function": step(model, batch) returns the loss, a mean over the
    batch's rows (shoal weighs batches and workers by their rows), or a dict with "loss" and other numbers to
    log; batch is what the data yields ((inputs, labels), or a dict). shoal still runs the backward pass,
    accumulation, clipping, precision and the algorithm's exchange."""
    metrics: dict | None = None
    """Test metrics of your own: name = "package.module:function" taking (outputs, labels) of the whole test set
    and returning a number (or an object with update/compute/reset, as torchmetrics' are)."""
    validation_split: float = 0.0
    """This share of the training rows (0 to < 1) is held out, drawn by the seed (the same rows for any number
    of workers); each training worker validates its slice of them with its own model after every epoch
    (`epoch_end.validation`, and each worker's)."""
    seed: int = 0
    """Seeds model initialisation, shuffling and dropout: the same seed gives the same run."""
    eval_every: int = 1
    """Evaluate on the test set every this many epochs (and always after the last)."""
    shuffle: bool = True
    """Shuffle each worker's rows every epoch."""
    validate_every: int = 0
    """Also evaluate on the test set, in the background on the coordinator, every this many updates
    (parameter-server algorithms: updates the server applied; others: steps); 0 = never."""
    validate_seconds: float = 0.0
    """... or every this many seconds; 0 = never."""
    scheduler: dict | None = None
    """A torch.optim.lr_scheduler by name with its arguments, e.g. { name = "StepLR", step_size = 10 }."""
    accumulate: int | str | None = None
    """Sum the gradients of this many batches (or "epoch": the worker's whole share, cNeural's batch mode)
    into one exchange and one optimizer step; sync (and one worker alone) only."""
    precision: str = "fp32"
    """fp32, or bf16: the forward pass under autocast (CPU and CUDA), the loss and the update in fp32."""
    clip_norm: float | None = None
    """Clip the gradients' global norm to this before each step (after the workers' gradients are combined)."""
    stop: dict | None = None
    """End before the last epoch: { metric = "test_loss", below = 0.05 } (cNeural's error threshold), above = ...,
    and/or patience = N epochs without an improvement of more than min_delta (early stopping)."""

    def __post_init__(self) -> None:
        _at_least("train.epochs", self.epochs, 1)
        _at_least("train.batch_size", self.batch_size, 1)
        _at_least("train.eval_every", self.eval_every, 1)
        _within("train.seed", self.seed, 0, SEED_LIMIT - 1)
        _at_least("train.validate_every", self.validate_every, 0)
        if not (isinstance(self.validate_seconds, (int, float)) and not isinstance(self.validate_seconds, bool)
                and math.isfinite(self.validate_seconds) and self.validate_seconds >= 0):
            raise ConfigError(f"train.validate_seconds: must be seconds >= 0, got {self.validate_seconds!r}")
        if self.accumulate is not None and self.accumulate != "epoch":
            _at_least("train.accumulate", self.accumulate, 1)
        if self.precision not in PRECISIONS:
            raise ConfigError(f"train.precision: must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.clip_norm is not None and not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ConfigError(f"train.clip_norm: must be a number > 0, got {self.clip_norm!r}")
        if self.step is not None:
            check_reference("train.step", self.step)
        if self.metrics is not None:
            for name, reference in self.metrics.items():
                if not re.fullmatch(r"[A-Za-z_]\w*", name):
                    raise ConfigError(f"train.metrics.{name}: a metric's name is letters, digits and _")
                check_reference(f"train.metrics.{name}", reference)
        if not (isinstance(self.validation_split, (int, float)) and not isinstance(self.validation_split, bool)
                and 0 <= self.validation_split < 1):
            raise ConfigError(f"train.validation_split: must be a share from 0 to below 1, got "
                              f"{self.validation_split!r}")
        if not (self.loss in LOSSES or is_reference(self.loss) or re.fullmatch(r"[A-Z]\w*Loss", self.loss)):
            raise ConfigError(f"train.loss: unknown loss {self.loss!r}; choose one of {', '.join(LOSSES)}, a torch.nn "
                              "loss class (like SmoothL1Loss) or 'package.module:function'")
        if not isinstance(self.optimizer.get("name"), str):
            raise ConfigError("train.optimizer.name: required, e.g. optimizer = { name = \"adam\", lr = 0.001 }")


@dataclass
class ClusterConfig:
    workers: int = 1
    """Worker processes on this machine (per node on a cluster)."""
    threads: int = 0
    """Compute threads per worker; 0 means cores / workers."""
    device: str = "auto"
    """cpu, cuda, or auto (cuda when present); cuda uses NCCL, cpu gloo."""
    timeout: float = 300.0
    """Seconds any collective may wait before the job fails."""
    stall_timeout: float = 30.0
    """Seconds a worker may go without a heartbeat, or stuck at one step while the others wait for it, before
    the others call it hung, whatever `timeout` is. Every worker beats each second from a thread of its own,
    also while it computes a long step or waits in a collective; one that is stopped (SIGSTOP), frozen or cut
    off falls silent. Its peers name it (rank, host, last step: "stopped answering") within this many seconds
    plus about two, leave the collective they wait in, and the job restarts (--max-restarts) or stops as for
    a dead worker; the silent worker is killed (SIGKILL) within seconds more. A worker whose training thread
    is deadlocked (in its step, on a lock) beats on, but its beats say that it trains and waits for nobody:
    once it has been busy at one step this long while another worker has waited as long in a collective,
    that worker names it ("stopped making progress") and leaves the same way. A worker whose steps advance,
    or that evaluates, checkpoints or loads data, is never taken for stuck; one step computed for this long
    while another worker waits as long is: keep it above the longest step. From 5 s to a week."""
    groups: int | str = 1
    """Split the training workers into this many groups (hierarchical algorithms): Downpour
    gives each group a sub-master; averaging and EASGD average within a group every
    `group_period` steps and across groups every `period`. "machine": averaging and synchronous
    EASGD make one group of each machine's workers."""
    balance: str | list[float] = "equal"
    """How an epoch's rows are shared among the training workers: "equal" shares; "speed", shares
    proportional to each worker's measured rows per second (moved at epoch boundaries); or a list of
    relative speeds, one per training worker, for machines whose speeds are known."""
    nodes: int | str = 1
    """Machines in the job (as --nnodes): a number, or "MIN:MAX" for a job that goes on while at least MIN
    remain and takes machines that join, up to MAX, at an epoch's end."""
    rejoin_timeout: float = 60.0
    """With nodes "MIN:MAX": seconds a lost machine has to come back before the others go on without it, and
    at the start how long the first machines wait for more than MIN."""
    hosts: list[str] | None = None
    """The machines `shoal train` starts from one terminal, "name" or "name:workers" (as --hosts)."""
    remote: str = "ssh {host}"
    """How to run a command on one of `hosts`: the command line is added as one last argument."""
    port: int = DEFAULT_PORT
    """The port on the first host where the machines meet (with `hosts`)."""
    memory_per_worker: int | str | None = None
    """Memory one worker takes (bytes, or "2GiB"), for `--workers auto`; default: torch's own
    footprint plus the worker's share of the training set."""

    def __post_init__(self) -> None:
        _at_least("cluster.workers", self.workers, 1)
        _within("cluster.threads", self.threads, 0, MAX_THREADS)
        if self.groups != GROUP_BY_MACHINE and (isinstance(self.groups, bool) or not isinstance(self.groups, int)
                                                or self.groups < 1):
            raise ConfigError(f"cluster.groups: must be an integer >= 1 or \"machine\", got {self.groups!r}")
        check_balance(self.balance)
        _at_least("cluster.port", self.port, 1)
        if self.port > 65535:
            raise ConfigError(f"cluster.port: must be a TCP port (1 to 65535), got {self.port}")
        if "{host}" not in self.remote:
            raise ConfigError(f"cluster.remote: must name the host as {{host}}, got {self.remote!r}")
        if self.memory_per_worker is not None:
            parse_size("cluster.memory_per_worker", self.memory_per_worker)
        if self.device not in DEVICES:
            raise ConfigError(f"cluster.device: must be one of {', '.join(DEVICES)}, got {self.device!r}")
        node_range(self.nodes, "cluster.nodes")
        low, high = TIMEOUT_RANGE
        if not (isinstance(self.rejoin_timeout, (int, float)) and not isinstance(self.rejoin_timeout, bool)
                and low <= self.rejoin_timeout <= high):
            raise ConfigError(f"cluster.rejoin_timeout: must be seconds from {low:g} to {high:g} (a week), "
                              f"got {self.rejoin_timeout!r}")
        if not (isinstance(self.timeout, (int, float)) and not isinstance(self.timeout, bool)
                and low <= self.timeout <= high):  # NaN fails the comparison too
            raise ConfigError(f"cluster.timeout: must be seconds from {low:g} to {high:g} (a week), "
                              f"got {self.timeout!r}")
        low, high = STALL_RANGE
        if not (isinstance(self.stall_timeout, (int, float)) and not isinstance(self.stall_timeout, bool)
                and low <= self.stall_timeout <= high):
            raise ConfigError(f"cluster.stall_timeout: must be seconds from {low:g} to {high:g} (a week), "
                              f"got {self.stall_timeout!r}")


@dataclass
class OutputConfig:
    run_dir: str | None = None
    """Run directory; default runs/<job name>-<date>-<time>."""
    progress: str = "auto"
    """auto (a bar on a terminal, lines otherwise), bar, lines or none."""
    loggers: list[str] = field(default_factory=list)
    """Where rank 0 also writes the run's records: "tensorboard", "mlflow" and/or "csv"."""
    mlflow_uri: str | None = None
    """The MLflow tracking URI; default file:RUN_DIR/mlruns."""
    mlflow_experiment: str | None = None
    """The MLflow experiment; default the job's name."""

    def __post_init__(self) -> None:
        if self.progress not in PROGRESS_MODES:
            raise ConfigError(f"output.progress: must be one of {', '.join(PROGRESS_MODES)}, got {self.progress!r}")
        if not isinstance(self.loggers, list) or not all(isinstance(name, str) for name in self.loggers):
            raise ConfigError(f"output.loggers: must be a list of names from {', '.join(LOGGERS)}, "
                              f"got {self.loggers!r}")
        for name in self.loggers:
            if name not in LOGGERS:
                raise ConfigError(f"output.loggers: unknown logger {name!r}; choose from {', '.join(LOGGERS)}")
            if self.loggers.count(name) > 1:
                raise ConfigError(f"output.loggers: {name!r} is named twice")


@dataclass
class CheckpointConfig:
    every: int = 1
    """Save a checkpoint every this many epochs (and after the last); 0 turns checkpoints off."""
    keep: int = 2
    """How many of the newest checkpoints to keep."""
    allow_nonfinite: bool = False
    """Non-finite weights (NaN, inf) are a failure: model.pt is not written from them (the job stops in one
    line) and a checkpoint holding them in the model's parameters or the optimizer's state is passed over on
    resume. True writes model.pt all the same, with a warning, and resumes from such checkpoints."""

    def __post_init__(self) -> None:
        _at_least("checkpoint.every", self.every, 0)
        _at_least("checkpoint.keep", self.keep, 1)


@dataclass
class JobConfig:
    model: ModelConfig
    data: DataConfig
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    name: str = "job"
    """The job's name (the job file's stem), used for the default run directory."""

    def to_dict(self) -> dict:
        """Plain data, with None left out (TOML has no null) and algorithm options flattened."""
        raw = drop_none(dataclasses.asdict(self))
        algorithm = raw.pop("algorithm")
        raw["algorithm"] = {"name": algorithm["name"], **algorithm.get("options", {})}
        return raw

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(key: str, value: Any) -> int:
    """Bytes from an integer or a string such as "512MB" or "1.5 GiB"."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        if match and match.group(2).lower() in SIZE_UNITS:
            size = int(float(match.group(1)) * SIZE_UNITS[match.group(2).lower()])
            if size > 0:
                return size
    raise ConfigError(f"{key}: must be a size in bytes, e.g. 536870912, \"512MB\" or \"2GiB\", got {value!r}")


def node_range(value: Any, key: str) -> tuple[int, int]:
    """(MIN, MAX) machines from `N` or "MIN:MAX" (torchrun's syntax); `key` names the option in errors."""
    text = str(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
    low, _, high = text.partition(":")
    try:
        minimum, maximum = int(low), int(high or low)
    except ValueError:
        raise ConfigError(f"{key}: must be a number of machines or MIN:MAX, got {value!r}") from None
    if not 1 <= minimum <= maximum:
        raise ConfigError(f"{key}: must be 1 <= MIN <= MAX, got {value!r}")
    return minimum, maximum


def check_balance(balance: Any) -> None:
    """cluster.balance: one of BALANCES, or a list of positive finite relative speeds."""
    if isinstance(balance, str) and balance in BALANCES:
        return
    if isinstance(balance, list) and balance and all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 0 for w in balance):
        return
    raise ConfigError(f"cluster.balance: must be \"equal\", \"speed\" or a list of relative speeds > 0, one per "
                      f"training worker, got {balance!r}")


def _at_least(key: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}: must be an integer >= {minimum}, got {value!r}")


def _within(key: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key}: must be an integer from {low} to {high}, got {value!r}")


def drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_none(v) for v in value]
    return value


def _matches(value: Any, annotation: Any) -> bool:
    """Whether a TOML value fits a field's annotation (int is accepted for float)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arm) for arm in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is list or annotation is list:
        if not isinstance(value, list):
            return False
        (item,) = typing.get_args(annotation) or (Any,)
        return all(_matches(v, item) for v in value)
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is Any:
        return True
    return isinstance(value, annotation)


def _type_name(annotation: Any) -> str:
    return str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")


def unknown_key(key: str, known: typing.Iterable[str]) -> ConfigError:
    section, _, leaf = key.rpartition(".")
    close = difflib.get_close_matches(leaf, list(known), n=1)
    hint = f" (did you mean '{section + '.' if section else ''}{close[0]}'?)" if close else ""
    return ConfigError(f"{key}: unknown key{hint}")


def build_section(cls: type, table: dict, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in table.items():
        if key not in names:
            raise unknown_key(f"{prefix}{key}", names)
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            if not isinstance(value, dict):
                raise ConfigError(f"{prefix}{key}: must be a table")
            values[key] = build_section(annotation, value, f"{prefix}{key}.")
        elif not _matches(value, annotation):
            raise ConfigError(f"{prefix}{key}: expected {_type_name(annotation)}, got {value!r}")
        else:
            values[key] = value
    try:
        return cls(**values)
    except TypeError as error:  # a required section is missing
        missing = str(error).rsplit(":", 1)[-1].strip().strip("'")
        raise ConfigError(f"{prefix}{missing}: required section is missing") from None


def section_fields() -> dict[str, type]:
    return {name: kind for name, kind in typing.get_type_hints(JobConfig).items() if dataclasses.is_dataclass(kind)}


def parse_override(text: str) -> tuple[list[str], Any]:
    """`section.key=value` -> (path, value); the value is read as TOML, else kept as a string."""
    key, equals, raw = text.partition("=")
    if not equals or not key.strip():
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(raw: dict, overrides: typing.Iterable[str]) -> dict:
    """Set each `section.key=value` in a raw job table (a copy is returned)."""
    raw = copy.deepcopy(raw)
    for text in overrides:
        path, value = parse_override(text)
        if path[:2] == ["train", "optimizer"] and len(path) > 2 and "optimizer" not in raw.get("train", {}):
            raw.setdefault("train", {})["optimizer"] = TrainConfig().optimizer  # override the default's keys
        table = raw
        for part in path[:-1]:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise ConfigError(f"--set {text!r}: '{part}' is not a table")
        table[path[-1]] = value
    return raw
