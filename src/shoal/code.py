"""The user's code that a job names: a training step, a loss, a transform, a scheduler, metrics.

A job is data every worker reads, so code enters it by reference, in one of two forms:
`"package.module:function"` (imported where it runs, as `model.factory` is) or the name of a file
in the run directory that `shoal.fit` wrote the user's object into by value (`"train.step.pkl"`),
so a function defined in a notebook works too. Either runs code: read back from a run directory,
a job's references are loaded only on the user's word (`--trust-code`; see `job_code`), and so are
the settings by which it would send the run's records elsewhere (`job_destinations`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shoal.errors import ConfigError, first_line
from shoal.objects import load_object

IMPORTED = re.compile(r"[\w.]+:\w+")
"""`package.module:function`."""
SHIPPED = re.compile(r"[\w.-]+\.pkl")
"""A file in the run directory holding an object written by value."""


def check_reference(key: str, value: Any) -> None:
    """`value` names code the way a job may: one line naming `key` otherwise."""
    if is_reference(value):
        return
    raise ConfigError(f"{key}: expected 'package.module:function' (or a file shoal.fit wrote into the run "
                      f"directory, NAME.pkl), got {value!r}")


def is_reference(value: Any) -> bool:
    return isinstance(value, str) and bool(IMPORTED.fullmatch(value) or SHIPPED.fullmatch(value))


def shipped(value: Any) -> bool:
    """Whether a reference names a file written by value (rather than an importable function)."""
    return isinstance(value, str) and bool(SHIPPED.fullmatch(value))


def load_code(reference: str, key: str, run_dir: str | Path | None) -> Any:
    """The object a reference names: imported, or read from the run directory's file (whose code runs as it
    loads: call only for a job the user wrote or vouched for). Failures are one line naming `key`."""
    check_reference(key, reference)
    if shipped(reference):
        return load_object(object_file(reference, run_dir, key), key)
    return imported(reference, key)


def imported(reference: str, key: str) -> Any:
    """`package.module:function`'s object, the current folder importable while its module loads (as `python -m`
    finds a user's modules); a failure is one line naming `key`."""
    module_name, _, name = reference.partition(":")
    with current_folder_importable():
        try:
            return getattr(importlib.import_module(module_name), name)
        except Exception as error:  # ImportError, AttributeError, or whatever the module raises as it loads
            raise ConfigError(f"{key}: cannot import {reference!r}: {first_line(error)}") from None


def job_code(job) -> list[tuple[str, str]]:
    """(its key, its reference) for every piece of the user's code a job names besides the model's: what a
    run directory's job.toml would make shoal run."""
    train = job.train
    found = [("train.loss", train.loss)] if is_reference(train.loss) else []
    found += [(key, value) for key, value in (("train.step", train.step), ("data.transform", job.data.transform))
              if value]
    factory = (train.scheduler or {}).get("factory")
    if factory:
        found.append(("train.scheduler.factory", factory))
    found += [(f"train.metrics.{name}", value) for name, value in (train.metrics or {}).items()]
    return found


def job_destinations(job) -> list[tuple[str, Any]]:
    """(its key, its value) for every setting by which a job sends the run's records beyond what it writes in
    its run directory: with the MLflow logger on, `output.loggers` and the MLflow keys that are set (a tracking
    server receives the job's settings, data paths included, and its metrics; a `file:` URI writes wherever it
    points). The logger is named whatever its URI, one rule for a logger that can send. The CSV and TensorBoard
    loggers write at fixed names inside the run directory and name nothing."""
    output = job.output
    if "mlflow" not in output.loggers:
        return []
    keys = (("output.mlflow_uri", output.mlflow_uri), ("output.mlflow_experiment", output.mlflow_experiment))
    return [("output.loggers", output.loggers), *((key, value) for key, value in keys if value is not None)]


@contextlib.contextmanager
def current_folder_importable() -> Iterator[None]:
    """The user's own modules import from the current folder, as `python -m` finds them; only meanwhile.

    Left on sys.path for good, the folder would shadow installed packages for the rest of the process.
    """
    folder = os.getcwd()
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)


def object_file(name: str, run_dir: str | Path | None, key: str = "model.object") -> Path:
    """The file that `key` (model.object, or another key naming code shipped by value) names: one inside the run
    directory, by a name relative to it. An absolute path, `..`, or a symlink out of the folder is refused: a
    copied run must not unpickle another's file, and nothing is read from wherever the current folder happens
    to be."""
    if run_dir is None:
        raise ConfigError(f"{key}: {name!r} is read from a run directory, and none is given here")
    path, folder = Path(name), Path(run_dir)
    if not name or path.is_absolute() or ".." in path.parts:
        raise ConfigError(f"{key}: {name!r} must name a file inside the run directory {folder}, relative to it")
    resolved = (folder / path).resolve()
    if folder.resolve() not in resolved.parents:
        raise ConfigError(f"{key}: {folder / path} leads out of the run directory {folder}")
    if not resolved.is_file():
        raise ConfigError(f"{key}: {folder / path}: no such file in the run directory")
    return resolved
