"""One worker's whole job: set up, train the epochs, evaluate and report on the coordinator.

Every rank runs this function (SPMD). Rank 0 is also the coordinator: it writes the events,
evaluates on the test set, shows progress and saves the final model.
"""

from __future__ import annotations

import platform
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
from shoal.model import build_model
from shoal.train.artifacts import save_model
from shoal.train.events import EventLog
from shoal.train.loop import EpochStats, Trainer
from shoal.train.objective import evaluate
from shoal.train.prepare import make_optimizer, prepare
from shoal.train.progress import Progress


def versions() -> dict[str, str]:
    return {"shoal": shoal.__version__, "torch": torch.__version__, "python": platform.python_version(),
            "numpy": np.__version__, "pyarrow": pyarrow.__version__}


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


def run_worker(job: JobConfig, info: DistInfo, run_dir: Path, threads: int) -> dict:
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

    events = progress = test_rows = None
    if coordinator:
        events = EventLog(run_dir)
        events.write("job_start", job=job.name, config=job.to_dict(), versions=versions(),
                     world_size=info.world_size, trainers=len(trainers), hosts=hosts, threads=threads,
                     device=str(device), algorithm=job.algorithm.name, train_rows=prepared.train_set.rows,
                     test_rows=prepared.test_set.rows if prepared.test_set else 0,
                     steps_per_epoch=loader.steps, parameters=sum(p.numel() for p in model.parameters()))
        events.write("data_loaded", seconds=max(load_seconds), per_rank=load_seconds)
        progress = Progress(job.output.progress, job.train.epochs, loader.steps, enabled=True)
        if prepared.test_set is not None:
            test_rows = prepared.test_set.read_all()
            import sklearn.metrics  # noqa: F401  (its import takes a second: not inside the first epoch's timing)

    trainer = Trainer(model, optimizer, prepared.objective, algorithm, loader, comm,
                      on_step=progress.step if progress else None)
    final: dict = {}
    comm.barrier()  # start together: the coordinator's set-up must not show up as the first epoch's wait
    started = time.perf_counter()
    for epoch in range(job.train.epochs):
        if progress:
            progress.start_epoch(epoch)
        stats = trainer.train_epoch(epoch)
        gathered = comm.all_gather(stats.as_tensor())
        if not coordinator:
            continue
        per_rank = [EpochStats.from_tensor(row) for row in gathered]
        evaluation_seconds, test_metrics = 0.0, {}
        last = epoch + 1 == job.train.epochs
        if test_rows is not None and ((epoch + 1) % job.train.eval_every == 0 or last):
            began = time.perf_counter()
            test_metrics = evaluate(model, prepared.objective, *test_rows, convert=loader.to_tensors)
            evaluation_seconds = time.perf_counter() - began
            final = test_metrics
        record = epoch_record(epoch, trainer.global_step, per_rank, hosts, test_metrics, evaluation_seconds)
        events.write("epoch_end", **record)
        progress.end_epoch(epoch, record)
    if coordinator:
        path = save_model(run_dir, model, prepared.spec, prepared.objective, prepared.train_set.classes,
                          prepared.train_set.feature_dtype.name)
        events.write("job_end", status="completed", test=final, seconds=time.perf_counter() - started,
                     epochs=job.train.epochs, steps=trainer.global_step, model=str(path))
        events.close()
    comm.barrier()  # nobody leaves (and tears down the group) while the coordinator still writes
    return final


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
