"""The Python API: run a job from a notebook or script and get its model and metrics back."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from shoal.cluster.env import threads_per_worker
from shoal.cluster.rendezvous import Nodes
from shoal.config import JobConfig, apply_overrides, parse_override
from shoal.errors import ConfigError
from shoal.events import EpochEnd, read_history
from shoal.jobs import from_dict, load_job
from shoal.model import Trust, check_trusted
from shoal.supervisor import Plan, supervise
from shoal.train.artifacts import load_model
from shoal.train.checkpoint import check_resumable
from shoal.train.directory import JOB_FILE, check_new_run_dir, new_run_dir, write_job_file
from shoal.train.lock import hold_run_dir
from shoal.train.loggers import check_installed
from shoal.train.prepare import check_world_size, prepare


@dataclass
class FitResult:
    """What a finished job gives back."""

    metrics: dict
    """Final test metrics (loss, accuracy, auc for two classes)."""
    model: torch.nn.Module
    """The trained model, in eval mode."""
    run_dir: Path
    """Where the job wrote its events, resolved job file and model."""
    epochs: list[EpochEnd] = field(default_factory=list)
    """The `epoch_end` events (shoal.events.EpochEnd), an epoch redone after a restart included."""


def resolve_job(job: str | Path | JobConfig | dict, overrides=(), workers: int | None = None) -> JobConfig:
    """A validated JobConfig from a file, a dict or a config object, with overrides applied."""
    overrides = list(overrides)
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"--workers: must be an integer >= 1, got {workers!r}")
        overrides.append(f"cluster.workers={workers}")
    if isinstance(job, JobConfig):
        job = job.to_dict() | {"name": job.name}
    if isinstance(job, dict):
        return from_dict(apply_overrides(job, overrides), name=job.get("name", "job"))
    return load_job(job, overrides)


def start(job: JobConfig, run_dir: Path, nodes: Nodes | None = None, *, resume: bool = False,
          max_restarts: int = 0) -> None:
    """Check the job, write its resolved file into this machine's run directory and run its workers.

    A failed attempt is recorded in the events; with restarts left, every machine's workers start
    again from the newest checkpoint. Errors in the user's input (exit status 2, a NaN loss among
    them) would fail again the same way and are not retried.
    """
    nodes = nodes or Nodes()
    check_installed(job.output.loggers)
    with contextlib.ExitStack() as held:
        if resume:  # a run still going is turned away before its data is read
            held.enter_context(_hold(run_dir, nodes))
        prepared = prepare(job)
        world_size = job.cluster.workers * nodes.count
        check_world_size(job, world_size, prepared.train_set)
        if resume:
            check_resumable(run_dir, job, prepared.spec, prepared.train_set, world_size)
        elif _holds(nodes):  # held only now: a job refused by its checks leaves no folder behind
            held.enter_context(_hold(run_dir, nodes))
            check_new_run_dir(run_dir)  # another job may have taken it since it was chosen
        run_dir.mkdir(parents=True, exist_ok=True)
        job.output.run_dir = str(run_dir)
        job_file = write_job_file(run_dir, job)
        threads = threads_per_worker(job.cluster.threads, job.cluster.workers)
        supervise(Plan(job_file, run_dir, workers=job.cluster.workers, threads=threads, timeout=job.cluster.timeout,
                       max_restarts=max_restarts, resume=resume), nodes)


def _holds(nodes: Nodes) -> bool:
    """Whether this node's launcher holds the run directory: node 0 holds it for every machine (they
    share it on a shared filesystem)."""
    return nodes.count == 1 or nodes.rank == 0


def _hold(run_dir: Path, nodes: Nodes) -> contextlib.AbstractContextManager:
    return hold_run_dir(run_dir) if _holds(nodes) else contextlib.nullcontext()


def fit(job: str | Path | JobConfig | dict, *, workers: int | None = None, run_dir: str | Path | None = None,
        overrides=(), max_restarts: int = 0) -> FitResult:
    """Train a job (a job file, a dict shaped like one, or a JobConfig) and return its results.

    With `max_restarts`, failed workers are restarted from the newest checkpoint that many times.
    """
    config = resolve_job(job, overrides, workers)
    directory = new_run_dir(config, run_dir)
    start(config, directory, max_restarts=max_restarts)
    return result(directory, trust_code=config.model.factory or False)  # the caller's own factory


def named_factory(overrides) -> str | None:
    """The model.factory the user names on the command line (`--set model.factory=...`), if any."""
    named = None
    for text in overrides:
        path, value = parse_override(text)
        if path == ["model", "factory"]:
            named = value
    return named


def resumed_job(run_dir: str | Path, overrides=(), trust_code: bool = False) -> JobConfig:
    """The job of a run directory to resume, with overrides applied.

    Its job.toml is data anyone may have written: a model.factory in it is imported (in the
    launcher and every worker) only when the user trusts the run directory, or names that
    factory again in the overrides.
    """
    job_file = Path(run_dir) / JOB_FILE
    if not job_file.exists():
        raise ConfigError(f"{run_dir}: no job.toml: not a shoal run directory")
    job = resolve_job(job_file, overrides)
    check_trusted({"factory": job.model.factory}, str(job_file), trust_code or named_factory(overrides) or False)
    return job


def resume(run_dir: str | Path, *, overrides=(), max_restarts: int = 0, trust_code: bool = False) -> FitResult:
    """Continue a stopped run from its newest checkpoint (as `shoal train --resume RUN_DIR`).

    A model built by a factory is refused unless `trust_code` is True or `overrides` name that
    factory again (`model.factory=...`): the run directory's job.toml would choose the code to run.
    """
    run_dir = Path(run_dir)
    job = resumed_job(run_dir, overrides, trust_code)
    start(job, run_dir, resume=True, max_restarts=max_restarts)
    return result(run_dir, trust_code=job.model.factory or False)


def final_metrics(run_dir: str | Path) -> dict:
    """The final test metrics of a finished run (empty without a test set), read from its events."""
    return _metrics(read_history(run_dir))


def _metrics(history) -> dict:
    return (history.end.test if history.end is not None else None) or {}


def result(run_dir: str | Path, *, trust_code: Trust = False) -> FitResult:
    """A finished run's results; `trust_code` as for `load_model` (the job's own factory, after a fit)."""
    history = read_history(run_dir)
    return FitResult(metrics=_metrics(history), model=load_model(run_dir, trust_code=trust_code),
                     run_dir=Path(run_dir), epochs=history.epochs)
