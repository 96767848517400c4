"""What `shoal.fit`'s keyword arguments become: a job table, the user's model file, datasets on disk.

A job is data (a TOML table) that every worker reads, so the objects a Python user hands over are
turned into data first: a module or a callable is written by value into the run directory (the
job names that file as `model.object`), and data held in memory is written to a dataset folder in
a temporary place that lives as long as the job.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shoal.cluster import scratch
from shoal.config import JobConfig, section_fields
from shoal.data.format import Dataset
from shoal.data.in_memory import write_in_memory
from shoal.errors import ConfigError, ShoalError, WorkerError
from shoal.hf_inputs import is_hugging_face, write_hugging_face
from shoal.jobs import load_job
from shoal.objects import save_object

MODEL_FILE = "model.object.pkl"
"""The user's model, shipped by value, in the run directory."""
CALLBACKS_FILE = "callbacks.pkl"
"""The user's callbacks, shipped by value to the coordinator, in the run directory."""
PENDING = "(written into the run directory)"  # model.object until the run directory is known
STAGING_PREFIX = scratch.DATA
"""The temporary folder that holds the datasets written from data in memory while fit runs."""


def base_table(job: str | Path | JobConfig | dict | None) -> dict:
    """The job the arguments start from: none, a file (complete, as `shoal train` reads it), a dict or a config."""
    if job is None:
        return {}
    if isinstance(job, (str, Path)):
        job = load_job(job)
    if isinstance(job, JobConfig):
        return job.to_dict() | {"name": job.name}
    if isinstance(job, dict):
        return dict(job)
    raise ConfigError(f"job: expected a job file, a dict or a JobConfig, got {type(job).__name__}")


def set_key(table: dict, section: str, key: str, value: Any) -> None:
    if value is not None:
        table.setdefault(section, {})[key] = value


def apply_arguments(table: dict, arguments: dict, sections: dict) -> dict:
    """`table` with the named arguments and whole sections (`cluster={...}`) set; objects left as they are."""
    table = {name: dict(value) if isinstance(value, dict) else value for name, value in table.items()}
    known = set(section_fields()) | {"algorithm"}
    for name, section in sections.items():
        if name not in known:
            raise ConfigError(f"fit: unknown argument {name!r} (the job's sections are {', '.join(sorted(known))})")
        if not isinstance(section, dict):
            raise ConfigError(f"{name}: expected a dict of the section's keys, got {type(section).__name__}")
        table.setdefault(name, {}).update(section)
    if "train" in sections:
        raise ConfigError("fit: train names the training data; give the job's [train] keys in job or overrides")
    check_loss(arguments["loss"])
    for key in ("epochs", "batch_size", "stop", "validation_split"):
        set_key(table, "train", key, arguments[key])
    if isinstance(arguments["loss"], str):  # a callable is shipped by code_arguments
        set_key(table, "train", "loss", arguments["loss"])
    optimizer = arguments["optimizer"]
    set_key(table, "train", "optimizer", {"name": optimizer} if isinstance(optimizer, str) else optimizer)
    algorithm = arguments["algorithm"]
    if algorithm is not None:
        table["algorithm"] = {"name": algorithm} if isinstance(algorithm, str) else dict(algorithm)
    return table


def check_loss(loss: Any) -> None:
    """A loss is a name or a callable (a function, or a loss object such as a weighted CrossEntropyLoss)."""
    if loss is not None and not isinstance(loss, str) and not callable(loss):
        raise ConfigError(f"loss: expected a name or a function of (outputs, labels), got {type(loss).__name__}: "
                          "give a torch loss by name (cross_entropy, binary_cross_entropy, mse, or a torch.nn "
                          "class like 'SmoothL1Loss'), a callable, or your function as 'package.module:function'")


def code_arguments(table: dict, *, step=None, loss=None, transform=None, scheduler=None, metrics=None) -> dict:
    """Set the job's keys for fit's code arguments; the objects to write into the run directory, by file name.

    A string is a reference (`package.module:function`) the job keeps as it is; a callable travels by value,
    as the model does, in a file of the run directory that the job names."""
    pending: dict[str, Any] = {}

    def refer(section: str, key: str, value: Any, what: str) -> str | None:
        if value is None or isinstance(value, str):
            return value
        stateful = section == "train.metrics" and all(hasattr(value, name) for name in ("update", "compute"))
        if not (callable(value) or stateful):
            raise ConfigError(f"{section}.{key}: expected {what}, got {type(value).__name__}")
        name = f"{section}.{key}.pkl"
        pending[name] = value
        return name

    set_key(table, "train", "step", refer("train", "step", step, "a function of (model, batch)"))
    if loss is not None and not isinstance(loss, str):
        set_key(table, "train", "loss", refer("train", "loss", loss, "a function of (outputs, labels)"))
    set_key(table, "data", "transform", refer("data", "transform", transform, "a function of a batch"))
    if scheduler is not None:
        options = dict(scheduler) if isinstance(scheduler, dict) else {"factory": scheduler}
        if "factory" in options:
            options["factory"] = refer("train.scheduler", "factory", options["factory"],
                                       "a function of the optimizer returning a scheduler")
        table.setdefault("train", {})["scheduler"] = options
    if metrics is not None:
        if not isinstance(metrics, dict):
            raise ConfigError(f"metrics: expected a dict of name -> metric, got {type(metrics).__name__}")
        table.setdefault("train", {})["metrics"] = {
            name: refer("train.metrics", str(name), metric, "a function of (outputs, labels) or a metric object")
            for name, metric in metrics.items()}
    return pending


def ship_code(pending: dict[str, Any], run_dir: Path) -> None:
    """Write each of fit's callables into the run directory, under the name the job gives it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, value in pending.items():
        save_object(value, run_dir / name, name.removesuffix(".pkl"))


def model_table(model: Any) -> dict | None:
    """The job's `model` section for the `model` argument; a module or callable waits for its file."""
    if model is None:
        return None
    if isinstance(model, str):
        return {"factory": model}
    if isinstance(model, list):
        return {"layers": model}
    if isinstance(model, dict):
        return dict(model)
    if callable(model):  # an nn.Module is callable too
        return {"object": PENDING}
    raise ConfigError(f"model: expected an nn.Module, a zero-argument callable, 'module:function', a layer list "
                      f"or a model table, got {type(model).__name__}")


def ship_model(model: Any, run_dir: Path) -> str:
    """Write the module or callable into the run directory; the path the job names."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return str(save_object(model, run_dir / MODEL_FILE, "model").resolve())


def ship_callbacks(callbacks: list, run_dir: Path) -> Path | None:
    """Write the callbacks into the run directory, for the coordinator; each has at least one of the hooks it
    calls (`shoal.train.stopping`)."""
    from shoal.train.stopping import HOOKS

    if not callbacks:
        return None
    for callback in callbacks:
        if not any(callable(getattr(callback, hook, None)) for hook in HOOKS):
            raise ConfigError(f"callbacks: {type(callback).__name__} has no on_epoch_end(epoch, metrics[, model]), "
                              "on_step(step, loss) nor on_train_end(metrics, model) method")
    run_dir.mkdir(parents=True, exist_ok=True)
    return save_object(list(callbacks), run_dir / CALLBACKS_FILE, "callbacks")


def is_path(data: Any) -> bool:
    return isinstance(data, (str, os.PathLike))


@contextlib.contextmanager
def datasets_on_disk(table: dict, train: Any, test: Any, label: str | None) -> Iterator[dict]:
    """`table` with data.train and data.test naming folders; data in memory is written to a temporary
    folder for the block's length, and removed after. An error inside the block names the argument
    (`train`, `test`) where it would name that folder, which the user never made."""
    folder = None
    written: dict[str, str] = {}
    try:
        data = table.setdefault("data", {})
        for key, value in (("train", train), ("test", test)):
            if value is None:
                continue
            if is_path(value):
                data[key] = os.fspath(value)
                continue
            folder = folder or scratch.make(STAGING_PREFIX, sweep_first=True)
            encoding = data.get("train") if key == "test" else None
            data[key] = written[key] = str(write_data(value, os.path.join(folder, key), key, label,
                                                      encoding).path)
        yield table
    except (ShoalError, WorkerError) as error:  # a failed job's line names the data as fit was given it too
        error.args = (named_arguments(str(error), written), *error.args[1:])
        raise
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def write_data(value: Any, out: str, where: str, label: str | None, encoding_from: str | None) -> Dataset:
    """Data held in memory as a dataset folder at `out`: a Hugging Face Dataset by its columns, anything
    else (an IterableDataset of dict items too) by `write_in_memory`."""
    if is_hugging_face(value):
        written = write_hugging_face(value, out, where, label=label, encoding_from=encoding_from)
        if written is not None:
            return written
    return write_in_memory(value, out, where, label=label, encoding_from=encoding_from)


def named_arguments(message: str, written: dict[str, str]) -> str:
    """`message` with each temporary dataset folder (and any file in it) named by fit's argument instead."""
    for key, path in written.items():
        message = re.sub(re.escape(path) + r"(/[^\s:,)]*)?", f"the {key} data given to fit", message)
    return message


def check_data_kept(job: JobConfig, job_file: str) -> None:
    """A run that `fit` trained on data held in memory cannot resume from it: it was removed when fit
    returned. Say so, and how to give the data again, instead of failing on a folder the user never made."""
    for key, path in (("data.train", job.data.train), ("data.test", job.data.test)):
        if path and Path(path).parent.name.startswith(STAGING_PREFIX) and not Path(path).exists():
            raise ConfigError(f"{job_file}: {key}: the run was trained by shoal.fit on data held in memory, "
                              f"removed when fit returned; give it again as a dataset folder: --set {key}=FOLDER "
                              f"(shoal.resume(run, overrides=['{key}=FOLDER']))")
