"""Rank 0's duties besides training: events, progress, evaluation, epoch records and the saved model.

Every rank runs the same runner (SPMD); the coordinator is the part only rank 0 holds. Keeping
it apart lets the runner read as the same steps on every rank, and lets a test drive the
coordinator's records without a process group.
"""

from __future__ import annotations

import dataclasses
import platform
import time
from pathlib import Path

import numpy as np
import pyarrow
import torch

import shoal
from shoal.algorithms import Algorithm
from shoal.config import JobConfig
from shoal.data.loader import Converter
from shoal.events import (
    EVENTS_FILE,
    Checkpoint,
    DataLoaded,
    EpochEnd,
    EventLog,
    JobEnd,
    JobStart,
    Progress,
    SecondsSplit,
    WorkerEpoch,
    WorkerMemory,
    read_history,
)
from shoal.run.artifacts import save_model
from shoal.train.balancer import rate
from shoal.train.held_out import combined as combined_validation
from shoal.train.loggers import Loggers, open_loggers
from shoal.train.loop import EpochStats
from shoal.train.objective import metric_names
from shoal.train.prepare import Prepared
from shoal.train.progress import ProgressDisplay
from shoal.train.step import combined as combined_logged
from shoal.train.step import evaluate_rows
from shoal.train.stopping import Callbacks
from shoal.train.user_metrics import job_metrics
from shoal.train.validation import Validator

PROGRESS_SECONDS = 5.0  # how often the coordinator records the step it is at
NAMING_ROWS = 8  # test rows the user's step is run on to learn the names of what it logs
LOGGED, HELD_OUT = "logged", "held_out"
"""The keys of a trainer's report (`Coordinator.end_epoch`): its step's logged sums, its held-out rows' metrics."""


def versions() -> dict[str, str]:
    return {"shoal": shoal.__version__, "torch": torch.__version__, "python": platform.python_version(),
            "numpy": np.__version__, "pyarrow": pyarrow.__version__}


class Coordinator:
    """Writes the run's events and model on rank 0; evaluates on the test set."""

    def __init__(self, job: JobConfig, run_dir: Path, prepared: Prepared, model: torch.nn.Module,
                 device: torch.device):
        self.job, self.run_dir, self.prepared, self.model, self.device = job, run_dir, prepared, model, device
        self.metrics = job_metrics(job, run_dir, prepared.test_set is not None, prepared.evaluate_by_step)
        self.events: EventLog | None = None  # opened by announce: an events file means the job has started
        self.loggers: Loggers | None = None  # TensorBoard, MLflow, CSV: fed by the event log
        self.progress: ProgressDisplay | None = None
        self.validator: Validator | None = None
        self.test_rows = self.convert = None
        self.final: dict = {}  # the latest test metrics
        self.latest: EpochEnd | None = None  # the latest epoch's record
        self.epoch = self.epoch_steps = 0  # the epoch in progress, and rank 0's steps in it
        self.optimizer: torch.optim.Optimizer | None = None  # the algorithm's, known from announce
        self.learning_rates: list[float] | None = None  # its groups' rates as the epoch in progress began
        self.resharded_from: int | None = None  # the workers that wrote a checkpoint resumed by resharding
        self.last_record = time.monotonic()

    def load_test_set(self) -> None:
        """Read the whole test set once (evaluation and background validation share it)."""
        test_set, prepared = self.prepared.test_set, self.prepared
        if test_set is None:
            return
        self.test_rows = test_set.read_all()
        self.convert = Converter.for_dataset(test_set, prepared.spec["input"], self.device,
                                             prepared.objective.label_dtype)

    def announce(self, first_epoch: int, details: JobStart, load_seconds: list[float], holdings: list,
                 algorithm: Algorithm | None = None) -> None:
        """The job's start (or resumption, and from how many workers' checkpoint when resharded) and its data
        load; the progress display and validation begin."""
        start = dataclasses.replace(details, from_epoch=first_epoch, versions=versions())
        started_before = (self.run_dir / EVENTS_FILE).is_file() and read_history(self.run_dir).started()
        self.loggers = open_loggers(self.job, self.run_dir, self.test_metric_names())
        self.events = EventLog(self.run_dir, listeners=[self.loggers])
        resumed = dataclasses.replace(start.resumed(), resharded_from=self.resharded_from)
        self.events.write(resumed if started_before else start)
        self.events.write(DataLoaded(seconds=max(load_seconds), per_rank=load_seconds, shares=holdings))
        self.optimizer = algorithm.optimizer if algorithm is not None else None
        self.progress = ProgressDisplay(self.job.output.progress, self.job.train.epochs, details.steps_per_epoch,
                                        enabled=True)
        if self.test_rows is not None:
            # its own copy of the user's metrics: it evaluates in another thread, while the epochs' go on
            self.validator = Validator.from_job(self.job, self.prepared, self.model, self.test_rows, self.convert,
                                                self.events, algorithm, self.metrics.copy() if self.metrics else None)
        self.last_record = time.monotonic()

    def epoch_begins(self, epoch: int, steps: int) -> None:
        """Epoch `epoch` starts; rank 0 runs `steps` steps in it (or serves for as many nominal steps)."""
        self.epoch, self.epoch_steps = epoch, steps
        # read now: the schedule's step at the epoch's end comes before its record
        self.learning_rates = learning_rates(self.optimizer)
        self.progress.start_epoch(epoch, steps)

    def after_step(self, epoch: int, step: int, step_in_epoch: int, loss: float) -> None:
        """The bar, background validation, and a `progress` record every PROGRESS_SECONDS."""
        self.progress.step(loss)
        self.offer(step)
        if time.monotonic() - self.last_record >= PROGRESS_SECONDS:
            self.last_record = time.monotonic()
            self.events.write(Progress(epoch=epoch + 1, step=step, step_in_epoch=step_in_epoch,
                                       steps_per_epoch=self.epoch_steps, loss=loss))

    def served(self, applied: int, updates_per_epoch: int, steps_per_epoch: int) -> None:
        """On a parameter server, after the epoch's `applied`-th update: a `progress` record every
        PROGRESS_SECONDS, so a live job is never silent."""
        if not updates_per_epoch or time.monotonic() - self.last_record < PROGRESS_SECONDS:
            return
        self.last_record = time.monotonic()
        epoch, done = self.epoch, min(applied, updates_per_epoch) - 1
        in_epoch = (done + 1) * steps_per_epoch // updates_per_epoch
        self.events.write(Progress(epoch=epoch + 1, step=epoch * steps_per_epoch + in_epoch,
                                   step_in_epoch=in_epoch, steps_per_epoch=steps_per_epoch))

    def offer(self, count: int) -> None:
        """A step or a server update happened: validate in the background if one is due."""
        if self.validator is not None:
            self.validator.offer(count)

    def evaluate(self, algorithm: Algorithm) -> tuple[dict, float]:
        """Test metrics of the consensus model and the seconds they took."""
        began = time.perf_counter()
        with self.validator.paused(), algorithm.consensus() as consensus:
            metrics = evaluate_rows(consensus, self.prepared.objective, self.prepared.evaluation_step, *self.test_rows,
                                    convert=self.convert, metrics=self.metrics or None)
        self.final = metrics
        return metrics, time.perf_counter() - began

    def test_metric_names(self) -> tuple[str, ...]:
        """The names the test set's metrics will have (the CSV file's columns): the loss's and the user's, or,
        where the user's step evaluates it, "loss" and what the step logs (read from its result on a few rows)."""
        if self.test_rows is None:
            return ()
        if not self.prepared.evaluate_by_step:
            return metric_names(self.prepared.objective, self.metrics.names)
        features, labels = (rows[:NAMING_ROWS] for rows in self.test_rows)
        return tuple(evaluate_rows(self.model, self.prepared.objective, self.prepared.evaluation_step, features,
                                   labels, self.convert))

    def end_epoch(self, epoch: int, step: int, per_rank: list[EpochStats], ranks: list[int], hosts: list[str],
                  algorithm: Algorithm, shares: Shares | None = None, reports: list[dict] | None = None) -> EpochEnd:
        """Evaluate when due, then write the epoch's record; the record. `reports`: each trainer's sums of what
        the user's step logged and its metrics on the rows it holds out, when the job has either."""
        last = epoch + 1 == self.job.train.epochs
        test, evaluation_seconds = {}, 0.0
        if self.test_rows is not None and ((epoch + 1) % self.job.train.eval_every == 0 or last):
            test, evaluation_seconds = self.evaluate(algorithm)
        record = epoch_record(epoch, step, per_rank, ranks, hosts, test, evaluation_seconds)
        record.algorithm = algorithm.epoch_report() or None
        record.learning_rates = self.learning_rates
        if shares is not None:
            record.balance = shares.mode
            record.next_shares = list(shares.moved) if shares.moved else None
            record.taken_back = True if shares.taken_back else None
        if reports is not None:
            add_reports(record, reports, self.job.train.step is not None)
        self.events.write(record)
        self.progress.end_epoch(epoch, record)
        self.latest = record
        return record

    def checkpoint_written(self, epoch: int, path: Path, seconds: float) -> None:
        self.events.write(Checkpoint(epoch=epoch, path=str(path), seconds=seconds))

    def complete(self, algorithm: Algorithm, seconds: float, steps: int, memory: list[WorkerMemory],
                 epochs: int, stopped: str | None = None, callbacks: Callbacks | None = None) -> None:
        """Save the consensus model, hand it to the callbacks' on_train_end, and write `job_end` (`stopped`:
        why it ended before its last epoch)."""
        if self.validator is not None:
            self.validator.close()
        prepared = self.prepared
        with algorithm.consensus() as consensus:
            path = save_model(self.run_dir, consensus, prepared.spec, prepared.objective.loss,
                              prepared.train_set.classes, prepared.train_set.feature_dtype.name,
                              training_set=prepared.train_set, allow_nonfinite=self.job.checkpoint.allow_nonfinite)
            if callbacks:
                callbacks.train_end(self.closing_metrics(), consensus)
        self.events.write(JobEnd(status="completed", test=self.final, seconds=seconds, epochs=epochs,
                                 steps=steps, model=str(path), memory=memory, message=stopped))

    def closing_metrics(self) -> dict[str, float]:
        """What on_train_end is told, named as on_epoch_end's metrics are: the last epoch's `train_loss` and the
        latest test metrics, as `test_<name>`."""
        train = {"train_loss": self.latest.train_loss} if self.latest is not None else {}
        return train | {f"test_{name}": value for name, value in self.final.items()}

    def close(self) -> None:
        if self.validator is not None:
            self.validator.close()
        if self.events is not None:
            self.events.close()
        if self.loggers is not None:
            self.loggers.close()


def learning_rates(optimizer: torch.optim.Optimizer | None) -> list[float] | None:
    """Each param group's learning rate, in group order (a rate may be a tensor); None without an optimizer."""
    if optimizer is None:
        return None
    return [float(group["lr"]) for group in optimizer.param_groups]


def add_reports(record: EpochEnd, reports: list[dict], stepped: bool) -> None:
    """Into the epoch's record: the mean of what the user's step logged (`stepped`), and each trainer's metrics on
    the rows it holds out, with their mean weighted by rows. `reports` go in the order of `record.workers`."""
    if stepped:
        record.train_metrics = combined_logged([report.get(LOGGED, {}) for report in reports]) or None
    validations = [report.get(HELD_OUT) for report in reports]
    if any(found is not None for found in validations):
        for worker, found in zip(record.workers, validations):
            worker.validation = found
        record.validation = combined_validation([found for found in validations if found is not None])


@dataclasses.dataclass
class Shares:
    """How the epoch's rows were shared: cluster.balance's mode, each trainer's rows, the next epoch's if moved,
    and whether that move takes back the one before (it did not shorten the epoch)."""

    mode: str
    rows: tuple[int, ...]
    moved: tuple[int, ...] | None = None
    taken_back: bool = False


def epoch_record(epoch: int, step: int, per_rank: list[EpochStats], ranks: list[int], hosts: list[str], test: dict,
                 evaluation_seconds: float) -> EpochEnd:
    """The `epoch_end` event: totals over the training ranks, the mean time split, and each worker's rate."""
    rows = sum(s.rows for s in per_rank)
    seconds = max(s.seconds for s in per_rank)
    count = len(per_rank)
    split = SecondsSplit(compute=sum(s.compute for s in per_rank) / count,
                         communication=sum(s.communication for s in per_rank) / count,
                         data=sum(s.data for s in per_rank) / count, evaluation=evaluation_seconds)
    workers = [WorkerEpoch(rank=rank, host=host, rows=int(s.rows), seconds=s.seconds,
                           steps_per_second=s.steps / s.seconds if s.seconds > 0 else 0.0,
                           compute=s.compute, communication=s.communication, data=s.data, rate=rate(s),
                           share=s.rows / rows if rows else 0.0)
               for rank, host, s in zip(ranks, hosts, per_rank)]
    return EpochEnd(epoch=epoch + 1, step=step, train_loss=sum(s.loss_sum for s in per_rank) / rows, test=test,
                    samples=int(rows), seconds=seconds, samples_per_second=rows / seconds if seconds > 0 else 0.0,
                    seconds_split=split, workers=workers)
