"""One worker's whole job: set up, train the epochs, evaluate, checkpoint and report.

Every rank runs this function (SPMD). Rank 0 is also the coordinator: it writes the events,
evaluates on the test set, shows progress and saves the final model. With `resume`, every rank
continues from the newest valid checkpoint, so the job ends with the weights an uninterrupted
job would have had.
"""

from __future__ import annotations

import platform
import random
import time
from pathlib import Path

import numpy as np
import pyarrow
import torch

import shoal
from shoal.algorithms import make_algorithm
from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo, choose_device
from shoal.cluster.heartbeat import Heartbeat
from shoal.config import JobConfig
from shoal.data.loader import Converter, ShardLoader
from shoal.data.partition import steps_per_epoch
from shoal.model import build_model
from shoal.train.artifacts import save_model
from shoal.train.checkpoint import (
    Checkpointer,
    check_resumable,
    find_latest,
    fingerprint,
    load_rank,
    random_state,
    restore_random_state,
)
from shoal.train.events import EventLog, read_events
from shoal.train.loop import EpochStats, Trainer
from shoal.train.memory import current_rss, peak_rss
from shoal.train.objective import evaluate
from shoal.train.prepare import check_world_size, make_optimizer, prepare
from shoal.train.progress import Progress
from shoal.train.validation import Validator

PROGRESS_SECONDS = 5.0  # how often the coordinator records the step it is at


def versions() -> dict[str, str]:
    return {"shoal": shoal.__version__, "torch": torch.__version__, "python": platform.python_version(),
            "numpy": np.__version__, "pyarrow": pyarrow.__version__}


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def run_worker(job: JobConfig, info: DistInfo, run_dir: Path, threads: int, resume: bool = False) -> dict:
    """Train this rank's part of the job; returns the final test metrics (rank 0) or {}."""
    device = choose_device(job.cluster.device, info)
    comm = Communicator(info.rank, info.world_size, device=device)
    prepared = prepare(job)
    coordinator = info.rank == 0

    seed_everything(job.train.seed)  # identical initial weights on every rank
    model = build_model(prepared.spec).to(device)
    optimizer = make_optimizer(job.train.optimizer, model.parameters())
    algorithm = make_algorithm(job.algorithm.name, job.algorithm.options, job.cluster.groups)
    check_world_size(job, info.world_size, prepared.train_set)  # again here for jobs started by torchrun or srun
    algorithm.setup(model, optimizer, comm)
    seed_everything(job.train.seed + 1 + info.rank)  # dropout differs between ranks
    trainers = algorithm.trainer_ranks(info.world_size)
    training = info.rank in trainers  # a parameter server (or sub-master) serves instead
    steps = steps_per_epoch(prepared.train_set.rows, len(trainers), job.train.batch_size)
    algorithm.plan(steps)

    # Imports that come anyway, made before the memory count so they do not show up as the data's.
    import torch._dynamo  # noqa: F401  (the first optimizer step imports it)

    memory_before_data = current_rss()
    loader = ShardLoader(
        prepared.train_set, rank=trainers.index(info.rank), world_size=len(trainers),
        batch_size=job.train.batch_size, seed=job.train.seed, shuffle=job.train.shuffle,
        device=device, label_dtype=prepared.objective.label_dtype, sample_shape=prepared.spec["input"],
        memory_budget=job.data.memory_budget, cache_dir=job.data.cache_dir,
    ) if training else None
    hosts = comm.all_gather_object(info.host)
    load_seconds = comm.all_gather(torch.tensor([loader.load_seconds if loader else 0.0], dtype=torch.float64))
    holdings = comm.all_gather_object(loader.describe() if loader else {"mode": "serves"})
    trainer = Trainer(model, optimizer, prepared.objective, algorithm, loader, comm) if training else None
    checkpointer = Checkpointer(run_dir, comm, job.checkpoint.keep)

    start_epoch, final, global_step = 0, {}, 0
    identity = fingerprint(job, prepared.spec, prepared.train_set.rows, info.world_size)
    if resume:
        if coordinator:  # also here for jobs started by torchrun or srun, which skip the launcher's check
            check_resumable(run_dir, job, prepared.spec, prepared.train_set.rows, info.world_size)
        found = comm.broadcast_object(find_latest(run_dir, info.world_size) if coordinator else None)
        if found is not None:
            state = load_rank(found.path, info.rank)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            algorithm.load_state_dict(state["algorithm"])
            global_step = state["global_step"]
            restore_random_state(state["random"], device)
            start_epoch, final = found.epoch, found.coordinator.get("test", {})
    if trainer is not None:
        trainer.global_step = global_step

    events = progress = test_rows = validator = None
    heartbeat = Heartbeat(run_dir, info.rank, info.host)
    if coordinator:
        events = EventLog(run_dir)
        details = dict(job=job.name, config=job.to_dict(), versions=versions(), world_size=info.world_size,
                       trainers=len(trainers), hosts=hosts, threads=threads, device=str(device),
                       algorithm=job.algorithm.name, train_rows=prepared.train_set.rows,
                       test_rows=prepared.test_set.rows if prepared.test_set else 0, steps_per_epoch=steps,
                       parameters=sum(p.numel() for p in model.parameters()))
        started_before = any(e["event"] == "job_start" for e in read_events(run_dir))
        events.write("job_resumed" if started_before else "job_start", from_epoch=start_epoch, **details)
        per_rank = load_seconds[:, 0].tolist()
        events.write("data_loaded", seconds=max(per_rank), per_rank=per_rank, shares=holdings)
        progress = Progress(job.output.progress, job.train.epochs, steps, enabled=True)
        if prepared.test_set is not None:
            test_rows = prepared.test_set.read_all()
            convert = Converter(prepared.test_set.feature_dtype, prepared.spec["input"], device,
                                prepared.objective.label_dtype)
            validator = Validator.from_job(job, prepared, model, test_rows, convert, events)
    if trainer is not None:
        trainer.on_step = step_callback(trainer, heartbeat, progress, events, steps, validator)
    else:
        algorithm.on_update = update_callback(heartbeat, validator)

    comm.barrier()  # start together: the coordinator's set-up must not show up as the first epoch's wait
    started = time.perf_counter()
    for epoch in range(start_epoch, job.train.epochs):
        if progress:
            progress.start_epoch(epoch)
        if trainer is not None:
            trainer.epoch = epoch
            stats = trainer.train_epoch(epoch)
        else:
            began = time.perf_counter()
            algorithm.serve_epoch(epoch)
            stats = EpochStats(seconds=time.perf_counter() - began)
        global_step = (epoch + 1) * steps
        gathered = comm.all_gather(stats.as_tensor())
        last = epoch + 1 == job.train.epochs
        if coordinator:
            per_rank = [EpochStats.from_tensor(gathered[rank]) for rank in trainers]
            evaluation_seconds, test_metrics = 0.0, {}
            if test_rows is not None and ((epoch + 1) % job.train.eval_every == 0 or last):
                began = time.perf_counter()
                with validator.paused(), algorithm.consensus() as consensus:
                    test_metrics = evaluate(consensus, prepared.objective, *test_rows, convert=convert)
                evaluation_seconds = time.perf_counter() - began
                final = test_metrics
            record = epoch_record(epoch, global_step, per_rank, trainers, [hosts[r] for r in trainers],
                                  test_metrics, evaluation_seconds)
            report = algorithm.epoch_report()
            if report:
                record["algorithm"] = report
            events.write("epoch_end", **record)
            progress.end_epoch(epoch, record)
        every = job.checkpoint.every
        if every and ((epoch + 1) % every == 0 or last):
            began = time.perf_counter()
            rank_state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "algorithm": algorithm.state_dict(), "global_step": global_step,
                          "random": random_state(device)}
            path = checkpointer.save(epoch + 1, rank_state,
                                     {"test": final, "fingerprint": identity} if coordinator else None)
            if coordinator:
                events.write("checkpoint", epoch=epoch + 1, path=str(path), seconds=time.perf_counter() - began)
    memory = comm.all_gather_object({"before_data": memory_before_data, "peak": peak_rss()})
    if coordinator:
        if validator is not None:
            validator.close()
        with algorithm.consensus() as consensus:
            path = save_model(run_dir, consensus, prepared.spec, prepared.objective, prepared.train_set.classes,
                              prepared.train_set.feature_dtype.name)
        events.write("job_end", status="completed", test=final, seconds=time.perf_counter() - started,
                     epochs=job.train.epochs, steps=global_step, model=str(path), memory=memory)
        events.close()
    comm.barrier()  # nobody leaves (and tears down the group) while the coordinator still writes
    heartbeat.close()
    if loader is not None:
        loader.close()
    return final


def step_callback(trainer: Trainer, heartbeat: Heartbeat, progress: Progress | None, events: EventLog | None,
                  steps_per_epoch: int, validator: Validator | None = None):
    """What happens after every step outside the loop: a heartbeat, the bar, a periodic progress record."""
    last_record = [time.monotonic()]

    def on_step(loss: float) -> None:
        heartbeat.beat(trainer.global_step)
        if progress is not None:
            progress.step(loss)
        if validator is not None:
            validator.offer(trainer.global_step)
        if events is not None and time.monotonic() - last_record[0] >= PROGRESS_SECONDS:
            last_record[0] = time.monotonic()
            epoch = getattr(trainer, "epoch", 0)
            events.write("progress", epoch=epoch + 1, step=trainer.global_step,
                         step_in_epoch=trainer.global_step - epoch * steps_per_epoch,
                         steps_per_epoch=steps_per_epoch, loss=loss)

    return on_step


def update_callback(heartbeat: Heartbeat, validator: Validator | None):
    """A server's counterpart of `step_callback`, after every update it applies."""

    def on_update(version: int) -> None:
        heartbeat.beat(version)
        if validator is not None:
            validator.offer(version)

    return on_update


def epoch_record(epoch: int, step: int, per_rank: list[EpochStats], ranks: list[int], hosts: list[str], test: dict,
                 evaluation_seconds: float) -> dict:
    """The `epoch_end` event: totals over the training ranks, the mean time split, and each worker's rate."""
    rows = sum(s.rows for s in per_rank)
    seconds = max(s.seconds for s in per_rank)
    count = len(per_rank)
    return {
        "epoch": epoch + 1,
        "step": step,
        "train_loss": sum(s.loss_sum for s in per_rank) / rows,
        "test": test,
        "samples": int(rows),
        "seconds": seconds,
        "samples_per_second": rows / seconds if seconds > 0 else 0.0,
        "seconds_split": {
            "compute": sum(s.compute for s in per_rank) / count,
            "communication": sum(s.communication for s in per_rank) / count,
            "data": sum(s.data for s in per_rank) / count,
            "evaluation": evaluation_seconds,
        },
        "workers": [
            {"rank": rank, "host": host, "rows": int(s.rows), "seconds": s.seconds,
             "steps_per_second": s.steps / s.seconds if s.seconds > 0 else 0.0,
             "compute": s.compute, "communication": s.communication, "data": s.data}
            for rank, host, s in zip(ranks, hosts, per_rank)
        ],
    }
