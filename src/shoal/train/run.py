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
from shoal.config import JobConfig
from shoal.data.loader import ShardLoader
from shoal.dist.collectives import Communicator
from shoal.dist.env import DistInfo, choose_device
from shoal.dist.heartbeat import Heartbeat
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
from shoal.train.objective import evaluate
from shoal.train.prepare import check_world_size, make_optimizer, prepare
from shoal.train.progress import Progress

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
    algorithm = make_algorithm(job.algorithm.name, job.algorithm.options)
    algorithm.setup(model, optimizer, comm)
    seed_everything(job.train.seed + 1 + info.rank)  # dropout differs between ranks
    trainers = algorithm.trainer_ranks(info.world_size)
    check_world_size(job, info.world_size)  # again here for jobs started by torchrun or srun
    if info.rank not in trainers:
        algorithm.serve()
        return {}

    loader = ShardLoader(
        prepared.train_set, rank=trainers.index(info.rank), world_size=len(trainers),
        batch_size=job.train.batch_size, seed=job.train.seed, shuffle=job.train.shuffle,
        device=device, label_dtype=prepared.objective.label_dtype, sample_shape=prepared.spec["input"],
    )
    hosts = comm.all_gather_object(info.host)
    load_seconds = comm.all_gather(torch.tensor([loader.load_seconds], dtype=torch.float64))[:, 0].tolist()
    trainer = Trainer(model, optimizer, prepared.objective, algorithm, loader, comm)
    checkpointer = Checkpointer(run_dir, comm, job.checkpoint.keep)

    start_epoch, final = 0, {}
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
            trainer.global_step = state["global_step"]
            restore_random_state(state["random"], device)
            start_epoch, final = found.epoch, found.coordinator.get("test", {})

    events = progress = test_rows = None
    heartbeat = Heartbeat(run_dir, info.rank, info.host)
    if coordinator:
        events = EventLog(run_dir)
        details = dict(job=job.name, config=job.to_dict(), versions=versions(), world_size=info.world_size,
                       trainers=len(trainers), hosts=hosts, threads=threads, device=str(device),
                       algorithm=job.algorithm.name, train_rows=prepared.train_set.rows,
                       test_rows=prepared.test_set.rows if prepared.test_set else 0, steps_per_epoch=loader.steps,
                       parameters=sum(p.numel() for p in model.parameters()))
        started_before = any(e["event"] == "job_start" for e in read_events(run_dir))
        events.write("job_resumed" if started_before else "job_start", from_epoch=start_epoch, **details)
        events.write("data_loaded", seconds=max(load_seconds), per_rank=load_seconds)
        progress = Progress(job.output.progress, job.train.epochs, loader.steps, enabled=True)
        if prepared.test_set is not None:
            test_rows = prepared.test_set.read_all()
            import sklearn.metrics  # noqa: F401  (its import takes a second: not inside the first epoch's timing)
    trainer.on_step = step_callback(trainer, heartbeat, progress, events, loader.steps)

    comm.barrier()  # start together: the coordinator's set-up must not show up as the first epoch's wait
    started = time.perf_counter()
    for epoch in range(start_epoch, job.train.epochs):
        trainer.epoch = epoch
        if progress:
            progress.start_epoch(epoch)
        stats = trainer.train_epoch(epoch)
        gathered = comm.all_gather(stats.as_tensor())
        last = epoch + 1 == job.train.epochs
        if coordinator:
            per_rank = [EpochStats.from_tensor(row) for row in gathered]
            evaluation_seconds, test_metrics = 0.0, {}
            if test_rows is not None and ((epoch + 1) % job.train.eval_every == 0 or last):
                began = time.perf_counter()
                test_metrics = evaluate(model, prepared.objective, *test_rows, convert=loader.to_tensors)
                evaluation_seconds = time.perf_counter() - began
                final = test_metrics
            record = epoch_record(epoch, trainer.global_step, per_rank, hosts, test_metrics, evaluation_seconds)
            events.write("epoch_end", **record)
            progress.end_epoch(epoch, record)
        every = job.checkpoint.every
        if every and ((epoch + 1) % every == 0 or last):
            began = time.perf_counter()
            rank_state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "algorithm": algorithm.state_dict(), "global_step": trainer.global_step,
                          "random": random_state(device)}
            path = checkpointer.save(epoch + 1, rank_state,
                                     {"test": final, "fingerprint": identity} if coordinator else None)
            if coordinator:
                events.write("checkpoint", epoch=epoch + 1, path=str(path), seconds=time.perf_counter() - began)
    if coordinator:
        path = save_model(run_dir, model, prepared.spec, prepared.objective, prepared.train_set.classes,
                          prepared.train_set.feature_dtype.name)
        events.write("job_end", status="completed", test=final, seconds=time.perf_counter() - started,
                     epochs=job.train.epochs, steps=trainer.global_step, model=str(path))
        events.close()
    comm.barrier()  # nobody leaves (and tears down the group) while the coordinator still writes
    heartbeat.close()
    return final


def step_callback(trainer: Trainer, heartbeat: Heartbeat, progress: Progress | None, events: EventLog | None,
                  steps_per_epoch: int):
    """What happens after every step outside the loop: a heartbeat, the bar, a periodic progress record."""
    last_record = [time.monotonic()]

    def on_step(loss: float) -> None:
        heartbeat.beat(trainer.global_step)
        if progress is not None:
            progress.step(loss)
        if events is not None and time.monotonic() - last_record[0] >= PROGRESS_SECONDS:
            last_record[0] = time.monotonic()
            epoch = getattr(trainer, "epoch", 0)
            events.write("progress", epoch=epoch + 1, step=trainer.global_step,
                         step_in_epoch=trainer.global_step - epoch * steps_per_epoch,
                         steps_per_epoch=steps_per_epoch, loss=loss)

    return on_step


def epoch_record(epoch: int, step: int, per_rank: list[EpochStats], hosts: list[str], test: dict,
                 evaluation_seconds: float) -> dict:
    """The `epoch_end` event: totals over ranks, the mean time split, and each worker's rate."""
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
            {"rank": rank, "host": hosts[rank], "rows": int(s.rows), "seconds": s.seconds,
             "steps_per_second": s.steps / s.seconds if s.seconds > 0 else 0.0,
             "compute": s.compute, "communication": s.communication, "data": s.data}
            for rank, s in enumerate(per_rank)
        ],
    }
