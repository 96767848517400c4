"""The Python API: run a job from a notebook or script and get its model and metrics back."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from shoal import in_process
from shoal.algorithms import make_algorithm, trainer_ranks
from shoal.cluster.env import threads_per_worker
from shoal.cluster.node import forkserver
from shoal.cluster.node.rendezvous import Nodes
from shoal.cluster.node.supervisor import Plan, supervise
from shoal.code import job_code, job_destinations, object_file
from shoal.config import GROUP_BY_MACHINE, ClusterConfig, JobConfig, apply_overrides, node_range, parse_override
from shoal.data.balance import equal_plan
from shoal.data.source import readable_here
from shoal.errors import ConfigError
from shoal.events import EVENTS_FILE, EpochEnd, Membership, read_history
from shoal.fit_inputs import (
    CALLBACKS_FILE,
    MODEL_FILE,
    PENDING,
    apply_arguments,
    base_table,
    check_data_kept,
    code_arguments,
    datasets_on_disk,
    model_table,
    ship_callbacks,
    ship_code,
    ship_model,
)
from shoal.jobs import from_dict, load_job
from shoal.model import Trust, check_trusted
from shoal.notebook import EpochRelay, in_notebook
from shoal.train.artifacts import load_model
from shoal.train.checkpoint import check_resumable, newest_epoch
from shoal.train.directory import JOB_FILE, check_new_run_dir, new_run_dir, write_job_file
from shoal.train.exits import restart_record
from shoal.train.lock import hold_run_dir
from shoal.train.loggers import check_installed
from shoal.train.prepare import Prepared, check_device, check_world_size, prepare


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


def resolve_job(job: str | Path | JobConfig | dict, overrides=(), workers: int | None = None,
                workers_name: str = "--workers") -> JobConfig:
    """A validated JobConfig from a file, a dict or a config object, with overrides applied; `workers_name`: what
    the user called the worker count (the command's option, or fit's argument)."""
    overrides = list(overrides)
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"{workers_name}: must be an integer >= 1, got {workers!r}")
        overrides.append(f"cluster.workers={workers}")
    if isinstance(job, JobConfig):
        job = job.to_dict() | {"name": job.name}
    if isinstance(job, dict):
        return from_dict(apply_overrides(job, overrides), name=job.get("name", "job"))
    return load_job(job, overrides)


def start(job: JobConfig, run_dir: Path, nodes: Nodes | None = None, *, resume: bool = False,
          max_restarts: int = 0, callbacks: Path | None = None, server: forkserver.ForkServer | None = None,
          here: Callable[[Path], None] | None = None) -> None:
    """Check the job, write its resolved file into this machine's run directory and run its workers
    (forked from `server`, the caller's fork server, where there is one), or with `here` (fit's workers=0)
    call it with that file instead, to run the one worker in this process.

    A failed attempt is recorded in the events; with restarts left, every machine's workers start
    again from the newest checkpoint. Errors in the user's input (exit status 2, a NaN loss among
    them) would fail again the same way and are not retried.
    """
    nodes = nodes or Nodes()
    check_installed(job.output.loggers)
    absolute_data_paths(job)
    with contextlib.ExitStack() as held:
        if resume:  # a run still going is turned away before its data is read
            held.enter_context(_hold(run_dir, nodes))
        if job.model.object:  # a shipped model is read from the run directory only: a missing one stops here
            object_file(job.model.object, run_dir)
        prepared = functools.cache(lambda: prepare(job, run_dir=run_dir))
        streamed = nodes.count > 1 and not datasets_here(job)  # read once the first machine serves them
        if not streamed:
            prepared()
        check_device(job)
        layout = functools.partial(check_layout, job, prepared, run_dir if resume else None)
        if nodes.count == 1:  # across machines the total is known once all have met: the supervisor checks it then
            layout(job.cluster.workers)
        if not resume and _holds(nodes):  # held only now: a job refused by its checks leaves no folder behind
            held.enter_context(_hold(run_dir, nodes))
            check_new_run_dir(run_dir)  # another job may have taken it since it was chosen
        run_dir.mkdir(parents=True, exist_ok=True)
        job.output.run_dir = str(run_dir)
        job_file = write_job_file(run_dir, job)
        if here is not None:
            return here(job_file)
        threads = threads_per_worker(job.cluster.threads, job.cluster.workers)
        supervise(Plan(job_file, run_dir, workers=job.cluster.workers, threads=threads, timeout=job.cluster.timeout,
                       restart_record=restart_record, max_restarts=max_restarts, resume=resume,
                       callbacks=callbacks, server=server, check_layout=layout if nodes.count > 1 else None,
                       elastic=nodes.elastic, rejoin_timeout=job.cluster.rejoin_timeout,
                       membership_record=functools.partial(membership_record, job, prepared),
                       datasets=[path for path in (job.data.train, job.data.test) if path], streamed=streamed), nodes)


def datasets_here(job: JobConfig) -> bool:
    """Whether this machine reads the job's datasets itself (a URI, or a path it sees); a machine that does
    not streams them from the first machine's data server (shoal.data.flight)."""
    return all(readable_here(path) for path in (job.data.train, job.data.test) if path)


def check_layout(job: JobConfig, prepared: Callable[[], Prepared], resumed: Path | None, world_size: int) -> None:
    """What `world_size` workers in all must fit: the algorithm's and the rows' checks, and a resume's
    checkpoints (another world size is resharded; `prepared()`: the job's opened datasets and model, read once)."""
    check_world_size(job, world_size, prepared().train_set)
    if resumed is not None:
        check_resumable(resumed, job, prepared().spec, prepared().train_set, world_size)


def membership_record(job: JobConfig, prepared: Callable[[], Prepared], run_dir: Path, world_size: int) -> Membership:
    """A `membership` event's checkpoint epoch and shares for `world_size` workers in all (its launcher adds
    the machines): equal shares of the training rows, as the next epoch starts with (speed shares are measured
    again from equal ones)."""
    groups = 1 if job.cluster.groups == GROUP_BY_MACHINE else job.cluster.groups
    trainers = len(trainer_ranks(make_algorithm(job.algorithm.name, job.algorithm.options, groups), world_size))
    shares = list(equal_plan(prepared().train_set.rows, trainers, job.train.batch_size).shares)
    fixed = isinstance(job.cluster.balance, list)  # a fixed speed list's shares: in data_loaded
    return Membership(from_epoch=newest_epoch(run_dir), world_size=world_size, shares=None if fixed else shares)


def absolute_data_paths(job: JobConfig) -> None:
    """The job's local data folders as absolute paths, as read from here: the run's job.toml keeps them,
    so that a resume from another folder reads the same data. A URI is left as it is."""
    data = job.data
    data.train = _absolute(data.train)
    data.test = _absolute(data.test)
    data.cache_dir = _absolute(data.cache_dir)


def _absolute(path: str | None) -> str | None:
    return path if not path or "://" in path else str(Path(path).absolute())


def _holds(nodes: Nodes) -> bool:
    """Whether this node's launcher holds the run directory: node 0 holds it for every machine (they
    share it on a shared filesystem)."""
    return nodes.count == 1 or nodes.rank == 0


def _hold(run_dir: Path, nodes: Nodes) -> contextlib.AbstractContextManager:
    return hold_run_dir(run_dir) if _holds(nodes) else contextlib.nullcontext()


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
        directory = new_run_dir(config, run_dir)
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

    Its job.toml is data anyone may have written: code it names (a model.factory, a model.object, a
    train.loss, train.step, data.transform, scheduler factory or metric function) is loaded (in the
    launcher and every worker) only when the user trusts the run directory, or names that factory again
    in the overrides; so is the MLflow logger it names, which would send the run's settings and metrics
    to the server of its choosing (`job_destinations`).
    """
    job_file = Path(run_dir) / JOB_FILE
    if not job_file.exists():
        raise ConfigError(f"{run_dir}: no job.toml: not a shoal run directory")
    job = resolve_job(job_file, overrides)
    check_data_kept(job, str(job_file))
    trust = trust_code or named_factory(overrides) or False
    check_trusted({"factory": job.model.factory, "object": job.model.object}, str(job_file), trust)
    given = given_keys(overrides)  # the user's other code (a loss function too): trusted, or given again
    for key, reference in job_code(job):
        if trust is not True and key not in given:
            raise ConfigError(f"{job_file}: {key} {reference!r} is code; resuming would run it: pass --trust-code "
                              f"(trust_code=True) if you trust this run directory, or give it again (--set {key}=...)")
    if not trust_code:
        check_destinations(job, job_file, given)
    return job


def check_destinations(job: JobConfig, job_file: Path, given: set[str]) -> None:
    """Refuse the MLflow settings a run's job.toml names and the user did not give again (`job_destinations`)."""
    uri = job.output.mlflow_uri
    where = f"at {uri!r}" if uri is not None else "in the run directory's mlruns"
    for key, value in job_destinations(job):
        if key not in given:
            raise ConfigError(f"{job_file}: {key} {value!r}: resuming would send the run's settings (data paths "
                              f"included) and metrics to MLflow {where}: pass --trust-code (trust_code=True) if "
                              f"you trust this run directory, or give it again (--set {key}=...)")


def given_keys(overrides) -> set[str]:
    """The job keys the user gives on the command line (`--set cluster.remote=...`): their values are the user's."""
    return {".".join(parse_override(text)[0]) for text in overrides}


def check_trusted_hosts(job: JobConfig, run_dir: str | Path, overrides=(), trust_code: bool = False,
                        hosts_given: bool = False) -> None:
    """Refuse to start programs that a run directory's job.toml names: its cluster.remote runs a command here,
    its cluster.hosts starts shoal on machines of its choosing. Either runs only on the user's word
    (--trust-code), or when the user gives the value again (--set, or --hosts/--hostfile for the hosts)."""
    if trust_code:
        return
    where, given = Path(run_dir) / JOB_FILE, given_keys(overrides)
    advice = "pass --trust-code if you trust this run directory, or give it again"
    if job.cluster.remote != ClusterConfig.remote and "cluster.remote" not in given:
        raise ConfigError(f"{where}: cluster.remote {job.cluster.remote!r} would run that command here; {advice} "
                          "(--set 'cluster.remote=...')")
    if job.cluster.hosts and not hosts_given and "cluster.hosts" not in given:
        raise ConfigError(f"{where}: cluster.hosts {job.cluster.hosts} would start shoal on those hosts through "
                          f"{job.cluster.remote!r}; {advice} (--hosts)")


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
