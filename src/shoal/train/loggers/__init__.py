"""Rank 0's loggers: TensorBoard, MLflow and a CSV file, fed by the event log as it writes each record.

The coordinator hands `Loggers` to its `EventLog` as a listener, so every record reaches the
loggers right after it reaches events.jsonl, from the training thread and the background
validation alike: the loggers show the file's numbers and nothing else. The launcher's
`membership` records (a job whose machines change) reach them through the file: as the
coordinator starts, the records written since its attempt's last start go first. A logger is a
convenience, never a reason to lose a job: one that fails (an MLflow server gone) prints one
warning line and is off for the rest of the job. TensorBoard and MLflow are optional extras;
naming one that is not installed is a ConfigError before any worker starts.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from shoal.config import JobConfig
from shoal.errors import ConfigError, ShoalError, first_line
from shoal.events import Event, JobStart, Membership, read_history

PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow"}
"""The package each optional logger imports; its extra has the logger's name."""


class Logger(Protocol):
    def write(self, event: Event) -> None: ...

    def close(self) -> None: ...


def check_installed(names: Sequence[str]) -> None:
    """A one-line error for a logger whose package is missing, with the command that installs it."""
    for name in names:
        package = PACKAGES.get(name)
        if package is not None and importlib.util.find_spec(package) is None:
            raise ConfigError(f"output.loggers: {name!r} needs the {package} package: pip install 'shoal[{name}]'")


class Loggers:
    """The job's loggers as one listener; a logger that raises warns once and is dropped."""

    def __init__(self, loggers: dict[str, Logger], stream=None, run_dir: Path | None = None):
        """`run_dir`: where the launcher's membership records are read from, as the coordinator starts."""
        self.loggers = loggers
        self.stream = stream or sys.stderr
        self.lock = threading.Lock()  # the training thread and the background validation both write
        self.run_dir = run_dir

    def __call__(self, event: Event) -> None:
        with self.lock:
            records = [event]
            if isinstance(event, JobStart) and self.run_dir is not None:
                records = [*new_membership(self.run_dir), event]
            for record in records:
                for name, logger in list(self.loggers.items()):
                    self.attempt(name, logger.write, record)

    def close(self) -> None:
        with self.lock:
            for name, logger in list(self.loggers.items()):
                self.attempt(name, logger.close)
            self.loggers.clear()

    def attempt(self, name: str, action, *arguments) -> None:
        try:
            action(*arguments)
        except Exception as error:  # any failure of a logger turns that logger off, never the job
            self.drop(name, error)

    def drop(self, name: str, error: BaseException) -> None:
        logger = self.loggers.pop(name, None)
        print(f"shoal: warning: the {name} logger failed and is off for the rest of the job: {first_line(error)}",
              file=self.stream, flush=True)
        if logger is not None:
            try:
                logger.close()
            except Exception:  # already reported; closing is a courtesy
                pass


def new_membership(run_dir: Path) -> list[Membership]:
    """The membership records of the attempt whose coordinator just wrote its job_start or job_resumed (the
    newest in the file): those after the start record before it. The launcher writes them, not the
    coordinator's event log; an unreadable file has none."""
    try:
        events = read_history(run_dir, warn=False).events
    except (OSError, ShoalError):
        return []
    found: list[Membership] = []
    pending: list[Membership] = []
    for event in events:
        if isinstance(event, Membership):
            pending.append(event)
        elif isinstance(event, JobStart):
            found, pending = pending, []
    return found


def open_loggers(job: JobConfig, run_dir: Path, test_metrics: Sequence[str] = (), stream=None) -> Loggers:
    """The loggers the job names, open; `test_metrics`: the metric names evaluation can give (the CSV
    file's columns). One that cannot open warns and is left out."""
    check_installed(job.output.loggers)
    loggers = Loggers({}, stream, Path(run_dir))
    for name in job.output.loggers:
        try:
            loggers.loggers[name] = _open(name, job, Path(run_dir), test_metrics)
        except Exception as error:  # a logger that cannot start must not stop the job
            loggers.drop(name, error)
    return loggers


def _open(name: str, job: JobConfig, run_dir: Path, test_metrics: Sequence[str]) -> Logger:
    if name == "csv":
        from shoal.train.loggers.to_csv import CsvLogger

        return CsvLogger(run_dir, test_metrics)
    if name == "tensorboard":
        from shoal.train.loggers.to_tensorboard import TensorBoardLogger

        return TensorBoardLogger(run_dir)
    from shoal.train.loggers.to_mlflow import MlflowLogger

    return MlflowLogger(run_dir, job.output.mlflow_uri, job.output.mlflow_experiment or job.name)
