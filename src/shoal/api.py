"""The Python API: run a job from a notebook or script and get its model and metrics back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from shoal.cluster.env import threads_per_worker
from shoal.cluster.rendezvous import Nodes
from shoal.config import JobConfig, apply_overrides
from shoal.errors import ConfigError
from shoal.events import EpochEnd, read_history
from shoal.jobs import from_dict, load_job
from shoal.supervisor import Plan, supervise
from shoal.train.artifacts import load_model
from shoal.train.checkpoint import check_resumable
from shoal.train.directory import JOB_FILE, new_run_dir, write_job_file
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
    prepared = prepare(job)
    world_size = job.cluster.workers * nodes.count
    check_world_size(job, world_size, prepared.train_set)
    if resume:
        check_resumable(run_dir, job, prepared.spec, prepared.train_set.rows, world_size)
    run_dir.mkdir(parents=True, exist_ok=True)
    job.output.run_dir = str(run_dir)
    job_file = write_job_file(run_dir, job)
    threads = threads_per_worker(job.cluster.threads, job.cluster.workers)
    supervise(Plan(job_file, run_dir, workers=job.cluster.workers, threads=threads, timeout=job.cluster.timeout,
                   max_restarts=max_restarts, resume=resume), nodes)


def fit(job: str | Path | JobConfig | dict, *, workers: int | None = None, run_dir: str | Path | None = None,
        overrides=(), max_restarts: int = 0) -> FitResult:
    """Train a job (a job file, a dict shaped like one, or a JobConfig) and return its results.

    With `max_restarts`, failed workers are restarted from the newest checkpoint that many times.
    """
    config = resolve_job(job, overrides, workers)
    directory = new_run_dir(config, run_dir)
    start(config, directory, max_restarts=max_restarts)
    return result(directory)


def resume(run_dir: str | Path, *, overrides=(), max_restarts: int = 0) -> FitResult:
    """Continue a stopped run from its newest checkpoint (as `shoal train --resume RUN_DIR`)."""
    run_dir = Path(run_dir)
    if not (run_dir / JOB_FILE).exists():
        raise ConfigError(f"{run_dir}: no job.toml: not a shoal run directory")
    start(resolve_job(run_dir / JOB_FILE, overrides), run_dir, resume=True, max_restarts=max_restarts)
    return result(run_dir)


def result(run_dir: str | Path) -> FitResult:
    history = read_history(run_dir)
    metrics = (history.end.test if history.end is not None else None) or {}
    return FitResult(metrics=metrics, model=load_model(run_dir), run_dir=Path(run_dir), epochs=history.epochs)
