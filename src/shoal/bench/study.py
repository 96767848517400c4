"""Run a scaling study: every (dataset size, worker count, trial) as a fresh job, one CSV row each.

The study folder holds `study.json` (what was studied: the job, its training set's fingerprint
and the seed), `data/` (the derived datasets), `runs/SIZE/wW-tT/` (each trial's run directory)
and `trials.csv`, rewritten whole (temporary file, then rename) after every finished trial.
A rerun of the same command skips the trials in the CSV and redoes an unfinished one from
scratch, so an interrupted study resumes where it stopped; it may also add sizes, worker counts
or trials to the grid. Trials run in rounds (every size and worker count once per round, the
worker counts in a seeded random order) so that a slow drift of the machine spreads over all
cells instead of biasing the last ones.

With hosts (`--hosts`), each trial runs on the first N of them (`--nodes`), started from here
as `shoal train --hosts` does (shoal.cluster.remote); `workers` is then the workers per host, a
trial's `workers` column the job's total, and its `nodes` and `hosts` columns say where it ran.
The study folder, the job's data and shoal must then be at the same paths on every host.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

from shoal.bench.grid import Size, derive_sizes
from shoal.bench.machine import describe
from shoal.cluster.env import cores, threads_per_worker
from shoal.cluster.node import forkserver
from shoal.config import JobConfig
from shoal.data.format import open_dataset
from shoal.durable import write_text_durably
from shoal.errors import ConfigError, ShoalError, WorkerError
from shoal.run.directory import write_job_file

TRIALS_FILE = "trials.csv"
STUDY_FILE = "study.json"
COLUMNS = [
    "size", "rows", "workers", "trial", "threads", "cores", "train_seconds", "job_seconds", "load_seconds",
    "wall_seconds", "compute_seconds", "communication_seconds", "data_seconds", "evaluation_seconds", "epochs",
    "samples_per_second", "train_loss", "test_loss", "test_accuracy", "test_auc", "run_dir", "finished",
    "nodes", "hosts", "trainers",
]
OPTIONAL = {"nodes", "hosts", "trainers"}  # absent from studies made before studies across machines (and trainers)
"""train_seconds: the epochs' training time (sum of epoch_end seconds: no loading, evaluation or
checkpoints); job_seconds: the job after loading; wall_seconds: the whole trial, process start
included; the four split columns are the per-epoch means over workers, summed over epochs."""
NUMBERS = {"rows": int, "workers": int, "trial": int, "threads": int, "cores": int, "epochs": int, "nodes": int,
           "trainers": int}
"""trainers: the workers that train; a parameter-server algorithm's server and sub-masters do not."""


@dataclass(frozen=True)
class Placement:
    """Where one cell runs: `nodes` hosts with `per_node` workers each (one local node without hosts)."""

    nodes: int
    per_node: int

    @property
    def workers(self) -> int:
        return self.nodes * self.per_node


@dataclass
class Grid:
    sizes: list[Size]
    placements: list[Placement]
    trials: int


def placements(workers: list[int], nodes: list[int] | None, hosts: list | None) -> list[Placement]:
    """The grid's placements; totals must differ, since the statistics compare worker totals."""
    if not hosts:
        return [Placement(1, count) for count in workers]
    counts = nodes or list(range(1, len(hosts) + 1))
    if max(counts) > len(hosts):
        raise ConfigError(f"--nodes: {max(counts)} nodes asked for, but --hosts names {len(hosts)}")
    grid = [Placement(count, per_node) for count in counts for per_node in workers]
    totals = [placement.workers for placement in grid]
    for placement in grid:
        if totals.count(placement.workers) > 1:
            raise ConfigError(f"--nodes x --workers: {placement.workers} workers in total comes from more than one "
                              "cell; the statistics compare totals, so give one worker count per host")
    return sorted(grid, key=lambda placement: placement.workers)


def run_study(job: JobConfig, out: Path, *, rows: list[int] | None = None,
              ratios: list[tuple[str, Fraction]] | None = None, workers: list[int], trials: int, seed: int = 0,
              progress: bool = True, hosts: list | None = None, nodes: list[int] | None = None) -> list[dict]:
    """Run every trial of the grid not yet in out/trials.csv; return all rows of the CSV. With `hosts`
    (shoal.cluster.remote.Host), `workers` are per host and each trial runs on the first of `nodes` hosts."""
    from shoal.train.prepare import check_world_size

    if trials < 1:
        raise ConfigError(f"--trials: must be at least 1, got {trials}")
    grid_places = placements(workers, nodes, hosts)
    train = open_dataset(job.data.train)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        _check_same_study(out, job, train.fingerprint(), seed)
        sizes = derive_sizes(train, out / "data", rows=rows, ratios=ratios, seed=seed)
        for size in sizes:  # refuse a cell that cannot run before the first trial starts
            dataset = open_dataset(size.path)
            for place in grid_places:
                try:
                    check_world_size(job, place.workers, dataset)
                except ConfigError as error:
                    raise ConfigError(f"size {size.label} ({size.rows:,} rows) with {place.workers} workers: "
                                      f"{error}") from None
    except ShoalError:
        if created:  # a study that never started leaves no folder behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    available = cores()
    if max(workers) * threads_per_worker(job.cluster.threads, max(workers)) > available:
        print(f"shoal: warning: up to {max(workers)} workers on {available} cores: workers share cores, "
              "so those times include contention", file=sys.stderr)
    done = read_trials(out)
    job_file = write_job_file(out, job) if hosts else None  # the job, where the hosts read it
    finished = {(row["size"], row["workers"], row["trial"]) for row in done}
    pending = [(trial, size, place) for trial, size, place in _order(Grid(sizes, grid_places, trials), seed)
               if (size.label, place.workers, trial) not in finished]
    totals = [place.workers for place in grid_places]
    bar = _bar(len(pending), len(finished & _cells(sizes, totals, trials)), progress)
    server = forkserver.start() if not hosts and pending else None
    if server is not None:  # each trial's workers come imported: the study's own import is not timed either
        server.wait_ready()
    current = None  # the run directory of the trial under way, until its row is recorded: a trial stopped
    # before that leaves nothing, a failed one (WorkerError) its run for a look
    try:
        for trial, size, place in pending:
            where = f" on {place.nodes} host(s)" if hosts else ""
            bar.set_postfix_str(f"size {size.label}, {place.workers} workers{where}, trial {trial}")
            if hosts:
                run = functools.partial(run_trial_on_hosts, job, job_file, out, size, place, trial, hosts[:place.nodes])
            else:
                run = functools.partial(run_trial, job, out, size, place.workers, trial, available, server)
            current = trial_path(out, size, place.workers, trial)
            record_trial(out, done, run)
            current = None
            bar.update()
    except WorkerError:
        current = None  # a failed trial's run is kept for a look
        raise
    finally:
        if server is not None:
            server.close()
        bar.close()
        if current is not None and not (done and done[-1]["run_dir"] == os.path.relpath(current, out)):
            # removed once the server has killed any worker of the stopped trial still writing there
            shutil.rmtree(current, ignore_errors=True)
    return done


def record_trial(out: Path, done: list[dict], run) -> None:
    """Run one trial (`run` returns its row) and add its row to `done` and out/trials.csv. A trial that
    finished keeps its row even when Ctrl-C comes as it ends: Python may raise it after the row is made
    and before the block that holds SIGINT back begins."""
    count = len(done)
    try:
        done.append(run())
        with _interrupt_deferred():
            write_trials(out, done)
    except BaseException:
        if len(done) > count:
            with _interrupt_deferred():
                write_trials(out, done)
        raise


def trial_path(out: Path, size: Size, workers: int, trial: int) -> Path:
    return out / "runs" / size.label.replace(":", "-") / f"w{workers}-t{trial}"


def trial_dir(out: Path, size: Size, workers: int, trial: int) -> Path:
    """A trial's run directory; one left by an interrupted trial is removed first."""
    run_dir = trial_path(out, size, workers, trial)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    return run_dir


def trial_overrides(job: JobConfig, size: Size, trial: int) -> list[str]:
    return [f"data.train={json.dumps(size.path)}", f"train.seed={job.train.seed + trial - 1}", "output.progress='none'"]


def run_trial(job: JobConfig, out: Path, size: Size, workers: int, trial: int, available: int,
              server: forkserver.ForkServer | None = None) -> dict:
    """One fresh job on this machine (its workers forked from `server`, if any); its row for the CSV."""
    from shoal.api import resolve_job, start

    run_dir = trial_dir(out, size, workers, trial)
    config = resolve_job(job, trial_overrides(job, size, trial), workers)
    began = time.perf_counter()
    try:
        start(config, run_dir, server=server)
        threads = threads_per_worker(config.cluster.threads, workers)
        row = trial_row(out, run_dir, size, workers, trial, threads, available, time.perf_counter() - began)
        return row | {"trainers": trainer_count(config.to_dict(), workers)}
    except WorkerError as error:  # kept for a look; a rerun starts this trial afresh
        error.args = (f"size {size.label}, {workers} workers, trial {trial} (run directory {run_dir}): {error}",)
        raise


def run_trial_on_hosts(job: JobConfig, job_file: Path, out: Path, size: Size, place: Placement, trial: int,
                       hosts: list) -> dict:
    """One fresh job on `hosts` (`job_file`: the study's job, written once for them to read), started from
    here as `shoal train --hosts` does; its row for the CSV."""
    from shoal.cluster.signals import Interrupted, interruptible
    from shoal.events import read_history

    run_dir = trial_dir(out, size, place.workers, trial)
    command = [sys.executable, "-m", "shoal", "train", str(job_file.resolve()), "--run-dir", str(run_dir.resolve()),
               "--hosts", ",".join(f"{host.name}:{place.per_node}" for host in hosts)]
    for override in trial_overrides(job, size, trial):
        command += ["--set", override]
    began = time.perf_counter()
    with interruptible():
        head = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _, errors = head.communicate()
        except Interrupted:
            head.send_signal(signal.SIGINT)  # the head stops every host
            head.wait()
            raise
    if head.returncode != 0:
        last = (errors.strip().splitlines() or ["no output"])[-1]
        raise WorkerError(f"size {size.label}, {place.workers} workers on {place.nodes} host(s), trial {trial} "
                          f"(run directory {run_dir}): {last}")
    threads = read_history(run_dir).start.threads  # as the hosts chose them
    row = trial_row(out, run_dir, size, place.workers, trial, threads, cores() * place.nodes,
                    time.perf_counter() - began)
    return row | {"nodes": place.nodes, "hosts": " ".join(host.name for host in hosts),
                  "trainers": trainer_count(job.to_dict(), place.workers)}


def trial_row(out: Path, run_dir: Path, size: Size, workers: int, trial: int, threads: int, available: int,
              wall: float) -> dict:
    """A finished trial's row, from its events."""
    from shoal.events import SPLIT_PARTS, DataLoaded, read_history

    history = read_history(run_dir)
    epochs, loaded, end = history.epochs, history.last(DataLoaded), history.end
    split = {part: sum(epoch.seconds_split.parts()[part] for epoch in epochs) for part in SPLIT_PARTS}
    train_seconds = sum(epoch.seconds for epoch in epochs)
    test = end.test or {}
    return {
        "size": size.label, "rows": size.rows, "workers": workers, "trial": trial, "threads": threads,
        "cores": available, "train_seconds": train_seconds, "job_seconds": end.seconds,
        "load_seconds": loaded.seconds, "wall_seconds": wall,
        **{f"{part}_seconds": seconds for part, seconds in split.items()},
        "epochs": len(epochs), "samples_per_second": sum(epoch.samples for epoch in epochs) / train_seconds,
        "train_loss": epochs[-1].train_loss, "test_loss": test.get("loss"), "test_accuracy": test.get("accuracy"),
        "test_auc": test.get("auc"), "run_dir": os.path.relpath(run_dir, out),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"), "nodes": 1, "hosts": "",
    }


def trainer_count(job: dict, workers: int) -> int:
    """How many of `workers` train under the job's algorithm (as `JobConfig.to_dict` or study.json's job
    gives it): all of them, less a parameter-server algorithm's server and sub-masters."""
    from shoal.algorithms import make_algorithm, trainer_ranks

    options = dict(job.get("algorithm") or {})  # to_dict flattens the options beside the name
    made = make_algorithm(options.pop("name", "sync"), options, (job.get("cluster") or {}).get("groups", 1))
    return len(trainer_ranks(made, workers))


def _fill_trainers(out: Path, rows: list[dict]) -> list[dict]:
    """Rows of a study made before the trainers column: their counts from the job in study.json."""
    if all(row.get("trainers") is not None for row in rows) or not (out / STUDY_FILE).exists():
        return rows
    try:
        job = json.loads((out / STUDY_FILE).read_text())["job"]
        return [row if row.get("trainers") is not None else row | {"trainers": trainer_count(job, row["workers"])}
                for row in rows]
    except (OSError, ValueError, KeyError, TypeError, ShoalError):
        return rows  # the analysis then counts every worker as a trainer


def read_trials(out: Path) -> list[dict]:
    """The rows of out/trials.csv with numbers as numbers (empty cells as None); [] when there is none."""
    path = out / TRIALS_FILE
    if not path.exists():
        return []
    rows = []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = set(COLUMNS) - set(reader.fieldnames or []) - OPTIONAL
        if missing:
            raise ConfigError(f"{path}: not a shoal study's trials (no column {sorted(missing)[0]!r})")
        for line, row in enumerate(reader, start=2):
            try:
                rows.append({"nodes": 1, "hosts": ""} | {key: _number(key, value) for key, value in row.items()})
            except ValueError:
                raise ConfigError(f"{path}:{line}: not a number where one belongs") from None
    return _fill_trainers(out, rows)


@contextlib.contextmanager
def _interrupt_deferred():
    """SIGINT held back for the block (in the main thread), delivered once it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def write_trials(out: Path, rows: list[dict]) -> None:
    """All rows to out/trials.csv at once: a crash leaves the previous file, never half of one."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=COLUMNS)
    writer.writeheader()
    for row in rows:
        writer.writerow({key: ("" if row.get(key) is None else row[key]) for key in COLUMNS})
    write_text_durably(out / TRIALS_FILE, text.getvalue())  # never through a link at the file's name


def _number(key: str, value: str):
    if key in ("size", "run_dir", "finished", "hosts"):
        return value
    if value == "":
        return 1 if key == "nodes" else None
    return NUMBERS.get(key, float)(value)


def _order(grid: Grid, seed: int) -> list[tuple[int, Size, Placement]]:
    """Rounds of trials: every size once per round, its placements in a seeded random order."""
    order = []
    for trial in range(1, grid.trials + 1):
        for size in grid.sizes:
            places = list(grid.placements)
            random.Random(f"{seed}-{trial}-{size.label}").shuffle(places)
            order += [(trial, size, place) for place in places]
    return order


def _cells(sizes: list[Size], workers: list[int], trials: int) -> set[tuple[str, int, int]]:
    return {(size.label, count, trial) for size in sizes for count in workers for trial in range(1, trials + 1)}


def _check_same_study(out: Path, job: JobConfig, fingerprint: str, seed: int) -> None:
    """Record what the folder studies, or refuse to mix another job's trials into it."""
    train = job.data.train if "://" in job.data.train else os.path.abspath(job.data.train)
    identity = {"job": _job_identity(job), "train": train, "fingerprint": fingerprint, "seed": seed}
    path = out / STUDY_FILE
    if path.exists():
        try:
            recorded = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ConfigError(f"{path}: unreadable ({error}); choose another --out") from None
        for key in identity:
            if recorded.get(key) != identity[key]:
                raise ConfigError(f"{path}: this folder holds a study with another {key} "
                                  f"({recorded.get(key)!r} there); choose another --out")
        return
    write_text_durably(path, json.dumps({**identity, "machine": describe()}, indent=1))


def _job_identity(job: JobConfig) -> dict:
    """The job as it trains, without what the study sets per trial (workers, data.train, output)."""
    table = job.to_dict()
    table.pop("output", None)
    for key in ("workers", "hosts", "remote", "port", "memory_per_worker"):  # where it runs, not what it trains
        table.get("cluster", {}).pop(key, None)
    table.get("data", {}).pop("train", None)
    return json.loads(json.dumps(table, default=str))


def _bar(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total + initial, initial=initial, unit="trial", desc="scaling study", disable=not enabled,
                dynamic_ncols=True, file=sys.stderr)
