"""Measure one worker's compute for a job's model on this machine, in a few seconds.

The planner prices communication from first principles, but compute only from measurement:
steps of the job's own model on rows of its own training set (sliced and converted as the
loader does), at a ladder of batch sizes; the optimizer's step; a flat copy (packing
messages); evaluation's forward pass; the store's read rate; the spread between two workers'
step times (what a per-step collective waits for); and a real one-worker job's start-up.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from shoal.config import JobConfig
from shoal.data.loader import ShardLoader
from shoal.plan.profile import Compute
from shoal.train.prepare import allocate_model, make_optimizer, prepare

PROBE_ROWS = 20_000  # rows read from the training set for the probe (its load rate and batches)
BATCH_LADDER = (16, 64, 256, 1024, 4096)
TIMED_SECONDS = 0.4  # per measured quantity, after warm-up


def timed(work, seconds: float = TIMED_SECONDS, at_least: int = 5, warm_up: int = 2) -> list[float]:
    """Seconds of each call of `work` over about `seconds` (after `warm_up` calls)."""
    for _ in range(warm_up):
        work()
    samples, began = [], time.perf_counter()
    while len(samples) < at_least or time.perf_counter() - began < seconds:
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return samples


def pair_spread(samples: list[float], pairs: int = 4000, seed: int = 0) -> float:
    """E[max(a, b)] - E[a] for two steps drawn from `samples`: the wait of the faster of two workers."""
    draws = random.Random(seed)
    mean = sum(samples) / len(samples)
    return sum(max(draws.choice(samples), draws.choice(samples)) for _ in range(pairs)) / pairs - mean


class ComputeProbe:
    """The job's model and a slice of its data, ready to time."""

    def __init__(self, job: JobConfig, threads: int):
        torch.set_num_threads(threads)
        self.job, self.threads = job, threads
        self.prepared = prepare(job)
        train_set = self.prepared.train_set
        self.loader = ShardLoader(train_set, rank=0, world_size=max(1, train_set.rows // PROBE_ROWS), batch_size=1,
                                  seed=0, label_dtype=self.prepared.objective.label_dtype,
                                  sample_shape=self.prepared.spec["input"])
        torch.manual_seed(job.train.seed)
        self.model = allocate_model(self.prepared.spec)
        self.optimizer = make_optimizer(job.train.optimizer, self.model.parameters())
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.order = np.random.default_rng(0).permutation(self.loader.rows)

    def step(self, batch: int) -> list[float]:
        """Slicing and converting a batch, forward and backward, as the training loop does."""
        starts = iter(range(0, 10**9, batch))

        def work() -> None:
            start = next(starts) % max(1, self.loader.rows - batch + 1)
            index = self.order[start : start + batch]
            inputs, labels = self.loader.to_tensors(self.loader.features[index], self.loader.labels[index])
            self.optimizer.zero_grad(set_to_none=True)
            self.prepared.objective(self.model(inputs), labels).backward()

        return timed(work)

    def update(self) -> float:
        for parameter in self.model.parameters():
            parameter.grad = torch.zeros_like(parameter)
        with torch.no_grad():
            return _median(timed(self.optimizer.step))

    def copy_per_byte(self) -> float:
        source = torch.randn(max(self.parameters, 1 << 18))
        target = torch.empty_like(source)
        return _median(timed(lambda: target.copy_(source))) / (source.numel() * 4)

    def evaluate_per_row(self) -> float:
        rows = min(self.loader.rows, 8192)
        inputs, _ = self.loader.to_tensors(self.loader.features[:rows], self.loader.labels[:rows])
        self.model.eval()
        with torch.no_grad():
            seconds = _median(timed(lambda: self.model(inputs), at_least=3))
        self.model.train()
        return seconds / rows

    def measure(self, batches: list[int], startup: float) -> Compute:
        steps = {batch: self.step(batch) for batch in batches if batch <= self.loader.rows}
        own = self.job.train.batch_size if self.job.train.batch_size in steps else max(steps)
        return Compute(model=model_key(self.prepared.spec),
                       parameters=self.parameters, threads=self.threads,
                       step_seconds={batch: _median(samples) for batch, samples in steps.items()},
                       update_seconds=self.update(), copy_seconds_per_byte=self.copy_per_byte(),
                       evaluate_seconds_per_row=self.evaluate_per_row(),
                       load_rows_per_second=self.loader.rows / max(self.loader.load_seconds, 1e-9),
                       startup_seconds=startup, step_spread=pair_spread(steps[own]))


def _median(samples: list[float]) -> float:
    return float(np.median(samples))


def model_key(spec: dict) -> str:
    """What a profile's compute was measured on: the model's description (layers, input, factory)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def batch_ladder(batch: int) -> list[int]:
    return sorted({*BATCH_LADDER, batch})


def measure_compute(job: JobConfig, threads: int, startup: float | None = None) -> Compute:
    """The job's compute here with `threads` threads; `startup` measured with a real job unless given."""
    if startup is None:
        startup = measure_startup()
    probe = ComputeProbe(job, threads)
    try:
        return probe.measure(batch_ladder(job.train.batch_size), startup)
    finally:
        probe.loader.close()


STARTUP_JOB = """
[model]
input = [4]
layers = [{{ dense = 2 }}]
[data]
train = "{train}"
[train]
epochs = 1
batch_size = 8
[checkpoint]
every = 0
[cluster]
threads = 1
[output]
progress = "none"
"""


def measure_startup() -> float:
    """Seconds from `shoal train` to a one-worker job's first step (its data load left out): the processes'
    start, their imports and the rendezvous, as every job pays them."""
    from shoal.data.synthetic import synth_binary
    from shoal.events import DataLoaded, read_history

    with tempfile.TemporaryDirectory(prefix="shoal-plan-") as folder:
        train = Path(folder) / "train"
        synth_binary(train, rows=64, features=4, seed=0)
        job = Path(folder) / "startup.toml"
        job.write_text(STARTUP_JOB.format(train=train))
        began = time.time()
        subprocess.run([sys.executable, "-m", "shoal", "train", str(job), "--workers", "1", "--run-dir",
                        str(Path(folder) / "run")], check=True, capture_output=True, timeout=300)
        history = read_history(Path(folder) / "run")
        loaded = history.last(DataLoaded)
        return history.start.time - began - (loaded.seconds if loaded else 0.0)
