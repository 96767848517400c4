"""The user's code that a job names: a training step, a loss, a transform, a scheduler, metrics.

A job is data every worker reads, so code enters it by reference, in one of two forms:
`"package.module:function"` (imported where it runs, as `model.factory` is) or the name of a file
in the run directory that `shoal.fit` wrote the user's object into by value (`"train.step.pkl"`),
so a function defined in a notebook works too. Either runs code: read back from a run directory,
a job's references are loaded only on the user's word (`--trust-code`; see `job_code`), and so are
the settings by which it would send the run's records elsewhere (`job_destinations`).

When that code fails, the user debugs it by its traceback: code read back by value gets its file
names again (`with_file_names`), and `user_traceback` gives the user's frames for the worker's
stderr and the run's `job_end`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import linecache
import os
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import CodeType, FunctionType, ModuleType
from typing import Any

from shoal.errors import ConfigError, UserCodeError, first_line
from shoal.objects import load_object

IMPORTED = re.compile(r"[\w.]+:\w+")
"""`package.module:function`."""
SHIPPED = re.compile(r"[\w.-]+\.pkl")
"""A file in the run directory holding an object written by value."""
DYNAMIC_CODE = "<dynamic-code>"
"""The file name cloudpickle gives every function it writes by value."""
DECORATOR_LINES = 20
"""How far below a function's first line (its first decorator's) its `def` may stand."""
METHODS = (FunctionType, staticmethod, classmethod, property)
TRACEBACK_LINES = 50
"""How much of the user's traceback a failure record keeps: its last lines, where the error is."""
USER_TRACEBACK = "user_traceback"
"""The worker's error file's entry (in `extraInfo`) holding the user's traceback, for the launcher's job_end."""
SHOAL_FOLDER = Path(__file__).resolve().parent


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
        return with_file_names(load_object(object_file(reference, run_dir, key), key))
    return imported(reference, key)


def with_file_names(value: Any) -> Any:
    """`value` (code read back by value) with its functions' own file names again, so that a traceback through
    them names the user's file and line, not cloudpickle's `<dynamic-code>`: each function (its methods, closures
    and the functions it calls by value too) is named after its module's file (`__file__`, which the pickle
    keeps) where that file, read here, defines it at the function's first line. Anything else keeps its name."""
    pending, seen = [value], set()
    while pending:
        item = pending.pop()
        if id(item) in seen or isinstance(item, (str, bytes, ModuleType)):
            continue
        seen.add(id(item))
        pending += _parts(item)
    return value


def _parts(item: Any) -> list[Any]:
    """What a function or class written by value refers to (renaming the function on the way); for a
    function that was not written by value, nothing: its module holds it, unchanged."""
    if isinstance(item, FunctionType):
        if item.__code__.co_filename != DYNAMIC_CODE:
            return []
        file = item.__globals__.get("__file__")
        if isinstance(file, str) and defined_at(file, item.__code__):
            item.__code__ = renamed(item.__code__, file)
        return [*item.__globals__.values(), *_closed_over(item), *(item.__defaults__ or ()),
                *(item.__kwdefaults__ or {}).values()]
    if isinstance(item, type):
        # its methods only: a class's other attributes are data (or a library's whole namespace)
        return [*(part for part in vars(item).values() if isinstance(part, METHODS)), *item.__bases__]
    if isinstance(item, (staticmethod, classmethod)):
        return [item.__func__]
    if isinstance(item, property):
        return [item.fget, item.fset, item.fdel]
    if isinstance(item, functools.partial):
        return [item.func, *item.args, *item.keywords.values()]
    if isinstance(item, (list, tuple, set, frozenset)):
        return list(item)
    if isinstance(item, dict):
        return list(item.values())
    return [type(item)]


def _closed_over(function: FunctionType) -> list[Any]:
    """The values a function's closure holds."""
    values = []
    for cell in function.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # a variable not yet assigned
            continue
    return values


def defined_at(file: str, code: CodeType) -> bool:
    """Whether `file`, read here, holds `code`'s definition at its first line (after any decorators): a
    function's module file names it only then (a function a dataclass or `exec` made has the module's globals,
    but not its lines)."""
    lines = linecache.getlines(file)[code.co_firstlineno - 1:code.co_firstlineno - 1 + DECORATOR_LINES]
    if code.co_name == "<lambda>":
        return bool(lines) and re.search(r"\blambda\b", lines[0]) is not None
    definition = re.compile(rf"^\s*(async\s+)?def\s+{re.escape(code.co_name)}\s*[(\[]")
    return any(definition.match(line) for line in lines)


def renamed(code: CodeType, file: str) -> CodeType:
    """`code`, and the code it defines (nested functions, lambdas, comprehensions), named after `file`."""
    constants = tuple(renamed(constant, file) if isinstance(constant, CodeType) else constant
                      for constant in code.co_consts)
    return code.replace(co_filename=file, co_consts=constants)


def user_traceback(error: BaseException, lines: int | None = None) -> str | None:
    """The traceback of the user's own error that a UserCodeError carries as its cause, as Python prints it,
    from the user's first frame on (shoal's frames that called the user's code are left out); its last `lines`
    lines when given. None for any other error."""
    cause = error.__cause__ if isinstance(error, UserCodeError) else None
    if cause is None:
        return None
    frames = cause.__traceback__
    while frames is not None and frames.tb_next is not None and _shoals(frames.tb_frame.f_code.co_filename):
        frames = frames.tb_next
    text = "".join(traceback.format_exception(type(cause), cause, frames)).rstrip("\n").splitlines()
    if lines is not None and len(text) > lines:
        text = [text[0], f"  ... ({len(text) - lines} lines above left out)", *text[-lines:]]
    return "\n".join(text)


def _shoals(file: str) -> bool:
    """Whether a frame's file is shoal's own."""
    return SHOAL_FOLDER in Path(file).resolve().parents


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
