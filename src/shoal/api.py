"""The Python API: run a job from a notebook or script and get its model and metrics back."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from shoal import in_process
from shoal.cluster.node import forkserver
from shoal.cluster.node.rendezvous import Nodes
from shoal.config import JobConfig, node_range
from shoal.errors import ConfigError
from shoal.events import EVENTS_FILE, EpochEnd, read_history
from shoal.fit_inputs import (
    CALLBACKS_FILE,
    MODEL_FILE,
    PENDING,
    apply_arguments,
    base_table,
    code_arguments,
    datasets_on_disk,
    model_table,
    ship_callbacks,
    ship_code,
    ship_model,
)
from shoal.launching import Launch, new_run_directory, resolve_job, resumed_job
from shoal.model import Trust
from shoal.notebook import EpochRelay, in_notebook
from shoal.run.artifacts import load_model


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


def start(job: JobConfig, run_dir: str | Path, nodes: Nodes | None = None, *, resume: bool = False,
          max_restarts: int = 0, callbacks: Path | None = None, server: forkserver.ForkServer | None = None,
          here: Callable[[Path], None] | None = None) -> None:
    """Run a resolved job on this machine in `run_dir` (shoal.launching.Launch: checked, its run directory
    held and written, its workers run, forked from `server`, the caller's fork server, where there is one);
    with `here` (fit's workers=0) call it with the run's job file instead, to run the one worker in this
    process. A failed attempt restarts from the newest checkpoint while `max_restarts` last."""
    Launch(job, Path(run_dir), nodes or Nodes(), resume=resume, max_restarts=max_restarts, callbacks=callbacks,
           server=server).run(here)


def fit(job: str | Path | JobConfig | dict | None = None, *, model=None, train=None, test=None,
        label: str | None = None, workers: int | None = None, algorithm: str | dict | None = None,
        epochs: int | None = None, batch_size: int | None = None, optimizer: str | dict | None = None,
        loss=None, step=None, transform=None, scheduler=None, metrics: dict | None = None,
        validation_split: float | None = None, stop: dict | None = None, callbacks: list | None = None,
        run_dir: str | Path | None = None, overrides=(), max_restarts: int = 0, **sections) -> FitResult:
    """Train and return the results: a job (a job file, a dict shaped like one, a JobConfig), or the job
    told in arguments, or both (the arguments win).

        result = shoal.fit(model=net, train=(x, y), test=(x_test, y_test), workers=2, epochs=5)

    `model`: an nn.Module or a zero-argument callable returning one (sent to the workers by value, so a
    class defined in a notebook works), 'package.module:function', or a layer list. `train`/`test`: a
    dataset folder, (features, labels) arrays or tensors, a pandas DataFrame with its `label` column,
    a Hugging Face `datasets.Dataset` (its `label` column, or the one `label` names; number columns as a
    DataFrame's, or one column of arrays or images as the sample),
    or a map-style torch Dataset or an iterable (IterableDataset, generator) of (features, label) items
    or of dicts (`label` names the label's key, default "label"; the other entries are fields, given
    back as dict batches for your `step`); data in memory is written to a temporary dataset for the
    job and removed after (so a Dataset whose items are random is refused: give the random part as
    `transform`). `algorithm` and `optimizer`: a name or a table; `stop`: the
    `train.stop` table; `sections`: any other part of the job as a dict (`cluster={"threads": 1}`,
    `checkpoint={"every": 0}`; the `[train]` section's other keys go in `job` or `overrides`, since
    `train` names the data).

    Your own code, sent to the workers by value as the model is (or named 'package.module:function'):
    `step(model, batch)` returns the batch's loss, or a dict with "loss" and numbers to log (batch: what
    the data yields, `(inputs, labels)` or a dict of fields; shoal keeps backward, accumulation, clipping
    and the algorithm's exchange); `loss` may be a callable of (outputs, labels); `transform(batch)`
    changes every training batch on its worker, every epoch (seeded per worker, epoch and step);
    `scheduler(optimizer)` builds a learning-rate scheduler (stepped per epoch; `scheduler={"factory":
    function, "interval": "step"}` per step); `metrics`: {name: metric(outputs, labels) or an object with
    update/compute/reset (torchmetrics)}, computed on the test set. `validation_split`: each worker holds
    out this share of its rows and reports metrics on them every epoch.

    `callbacks`: objects with any of `on_epoch_end(epoch, metrics[, model])` (after each epoch; metrics:
    `train_loss`, `test_<name>` when evaluated; a True return stops the job there, every worker
    together), `on_step(step, loss)` and `on_train_end(metrics, model)`, called by the coordinator (the
    model: the consensus model). With `max_restarts`, failed workers are restarted from the newest
    checkpoint that many times.

    `workers=0` debugs: the job's one worker runs in this process, in the calling thread (no launcher, no
    other process), with your own step, transform, loss, metrics and callbacks (and a copy of your module),
    so a `breakpoint()` in them or in the model's forward stops there; it trains the weights `workers=1`
    does, into the same run directory and events. An exception your code raises reaches you as it was
    raised, for a post-mortem; nothing is restarted (see shoal.in_process).
    """
    arguments = {"epochs": epochs, "batch_size": batch_size, "optimizer": optimizer, "loss": loss, "stop": stop,
                 "algorithm": algorithm, "validation_split": validation_split}
    table = apply_arguments(base_table(job), arguments, sections)
    code = code_arguments(table, step=step, loss=loss, transform=transform, scheduler=scheduler, metrics=metrics)
    shipped = model_table(model)
    if shipped is not None:
        table["model"] = shipped
    debug = _in_process(workers)
    with datasets_on_disk(table, train, test, label) as table:
        config = resolve_job(table, overrides, 1 if debug else workers, workers_name="workers")
        if node_range(config.cluster.nodes, "cluster.nodes") != (1, 1):
            raise ConfigError(f"cluster.nodes: shoal.fit trains on this machine, not {config.cluster.nodes!r}: "
                              "start `shoal train` on each machine for a job of several")
        relay = in_notebook() and config.output.progress == "auto"
        if relay:  # the workers' lines would go to the notebook server's log: this process shows the epochs
            config.output.progress = "none"
        directory = new_run_directory(config, run_dir)
        # the same process tree as `shoal train`: a fork server imports the workers while this process
        # reads the data; a job refused by its arguments above started none, nor does workers=0 (all runs here)
        with contextlib.nullcontext() if debug else forkserver.serving() as server, \
                _removed_unless_started(directory, list(code)), \
                EpochRelay(directory) if relay else contextlib.nullcontext():
            given = dict(code)  # what the run directory holds of the caller's objects, by file name
            if config.model.object == PENDING:  # named relative to the run directory, where it is read from
                config.model.object = Path(ship_model(model, directory)).name
                given[MODEL_FILE] = model
            ship_code(code, directory)
            loaders = in_process.caller_objects(directory, given)
            here = functools.partial(in_process.run, callbacks=list(callbacks or [])) if debug else None
            with in_process.read_as_given(loaders):  # in this process, the caller's own objects
                start(config, directory, max_restarts=max_restarts, callbacks=ship_callbacks(callbacks, directory),
                      server=server, here=here)
    with in_process.read_as_given(loaders):  # the caller's own factory or model
        return result(directory, trust_code=config.model.factory or config.model.object or False)


def _in_process(workers) -> bool:
    """Whether fit's `workers` asks for the job in this process (0); a count below that is refused."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise ConfigError(f"workers: must be an integer >= 0 (0: the job in this process, to debug it), "
                          f"got {workers!r}")
    return workers == 0


@contextlib.contextmanager
def _removed_unless_started(directory: Path, code: list[str]):
    """The files fit() writes into a new run directory before the job starts (`code`: its callables' files) go
    again if it never does: a job refused by its checks leaves no folder behind."""
    existed = directory.exists()
    try:
        yield
    except BaseException:
        if not (directory / EVENTS_FILE).exists():
            for name in (MODEL_FILE, CALLBACKS_FILE, *code):
                (directory / name).unlink(missing_ok=True)
            if not existed and directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
        raise


def resume(run_dir: str | Path, *, overrides=(), max_restarts: int = 0, trust_code: bool = False) -> FitResult:
    """Continue a stopped run from its newest checkpoint (as `shoal train --resume RUN_DIR`).

    A model built by a factory is refused unless `trust_code` is True or `overrides` name that
    factory again (`model.factory=...`): the run directory's job.toml would choose the code to run.
    """
    run_dir = Path(run_dir)
    job = resumed_job(run_dir, overrides, trust_code)
    with forkserver.serving() as server:  # as `shoal train --resume` does
        start(job, run_dir, resume=True, max_restarts=max_restarts, server=server)
    return result(run_dir, trust_code=job.model.factory or job.model.object or False)


def _metrics(history) -> dict:
    return (history.end.test if history.end is not None else None) or {}


def result(run_dir: str | Path, *, trust_code: Trust = False) -> FitResult:
    """A finished run's results; `trust_code` as for `load_model` (the job's own factory, after a fit)."""
    history = read_history(run_dir)
    return FitResult(metrics=_metrics(history), model=load_model(run_dir, trust_code=trust_code),
                     run_dir=Path(run_dir), epochs=history.epochs)
