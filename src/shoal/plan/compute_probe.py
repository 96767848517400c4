"""Measure one worker's compute for a job's model on this machine: under a minute for a small model.

The planner prices communication from first principles, but compute only from measurement:
steps of the job's own model on rows of its own training set (sliced and converted as the
loader does), at a ladder of batch sizes; the optimizer's step; a flat copy (packing
messages); evaluation's forward pass; the store's read rate; the spread between two workers'
step times (what a per-step collective waits for); a step after idle waits of 1 to 256 ms (what
a worker back from the network pays: its caches went cold while it waited). And one short real
job of the model (one worker, rows drawn from its training set), between two timings of the
probed step, gives the start-up every job pays and the real loop's step, which scales the
probed steps: the loop's own per-step work is measured, not guessed. Under a CPU quota tighter than
the probe's threads (a container's limit), every timing spans many of the quota's periods
(shoal.plan.cpu_quota.least_window): a shorter one reads where it fell among the quota's turns.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tomli_w
import torch

from shoal.config import JobConfig
from shoal.data.loader import ShardLoader
from shoal.plan.cpu_quota import least_window
from shoal.plan.profile import Compute, slowest_over_fastest
from shoal.train.objective import EVALUATE_ROWS
from shoal.train.prepare import allocate_model, make_optimizer, prepare
from shoal.train.step import evaluate_rows

PROBE_ROWS = 100_000  # rows read for the probe: batches gathered from as large a share as a worker's
BATCH_LADDER = (16, 64, 256, 1024, 4096)
TIMED_SECONDS = 0.6  # per measured quantity, after warm-up
# seconds: no batch above the job's own is timed whose step would take longer, nor evaluation's forward over more rows
LARGEST_STEP = 0.5
EVALUATE_FEWEST = 256  # rows: the fewest evaluation's forward is timed on, for a large model
BLOCKS = 3  # rounds a step is timed in, apart in time
# seconds idle before a step, as a network wait leaves it: dense where the cost climbs (1-8 ms), sparse where flat
RESUME_WAITS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.064, 0.256)
RESUME_SECONDS = 0.4  # per wait, about, over BLOCKS rounds
RESUME_STEPS = 80  # per wait at most: below some 50, one wait's median moved by half from one probe to the next


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


def cold_steps(work, wait: float, seconds: float, most: int) -> list[float]:
    """Seconds of `work` right after `wait` seconds asleep, repeated for about `seconds`: at least once, at most
    `most` times."""
    found, began = [], time.perf_counter()
    while not found or (len(found) < most and time.perf_counter() - began < seconds):
        time.sleep(wait)
        start = time.perf_counter()
        work()
        found.append(time.perf_counter() - start)
    return found


def resume_table(work, waits: tuple[float, ...] = RESUME_WAITS, seconds: float = RESUME_SECONDS,
                 most: int = RESUME_STEPS) -> dict[float, float]:
    """Seconds idle -> what `work` (a step) costs right after that long asleep (a worker back from waiting on
    the network) beyond a step amid back-to-back ones; kept rising with the wait, as caches only get colder.
    Not beyond the step right after the cold one: that one is still slow (on a 2-core VM 0.84 ms after a
    1.01 ms cold step, against 0.73 ms back to back). Each wait's steps are timed beside back-to-back ones,
    and the waits are walked in BLOCKS rounds apart in time, so that a slow moment spoils one round."""
    extra: dict[float, list[float]] = {wait: [] for wait in waits}
    for _ in range(BLOCKS):
        for wait in waits:
            steady = _median(timed(work, seconds=seconds / BLOCKS / 4, warm_up=1))
            extra[wait].append(_median(cold_steps(work, wait, seconds / BLOCKS, most // BLOCKS)) - steady)
    found, highest = {}, 0.0
    for wait in waits:
        highest = max(highest, _median(extra[wait]))
        found[wait] = highest
    return found


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
        self.window = least_window(threads)
        self.prepared = prepare(job)
        train_set = self.prepared.train_set
        self.loader = ShardLoader(train_set, rank=0, world_size=max(1, train_set.rows // PROBE_ROWS), batch_size=1,
                                  seed=0, label_dtype=self.prepared.objective.label_dtype,
                                  sample_shape=self.prepared.spec["input"])
        torch.manual_seed(job.train.seed)
        self.model = allocate_model(self.prepared.spec)
        self.optimizer = make_optimizer(job.train.optimizer, self.model)
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.order = np.random.default_rng(0).permutation(self.loader.rows)

    def __enter__(self) -> ComputeProbe:
        return self

    def __exit__(self, *_) -> None:
        self.loader.close()

    def step_work(self, batch: int):
        """One step as the training loop takes it: slicing and converting a batch, forward, backward, the
        optimizer's step and reading the loss."""
        starts = iter(range(0, 10**9, batch))

        def work() -> None:
            start = next(starts) % max(1, self.loader.rows - batch + 1)
            index = self.order[start : start + batch]
            rows = self.loader.to_tensors(self.loader.features[index], self.loader.labels[index])
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.loss(rows)
            loss.backward()
            self.optimizer.step()
            loss.item()

        return work

    def loss(self, batch) -> torch.Tensor:
        """A batch's loss as the loop computes it: the user's step, or the model's outputs under the job's loss."""
        if self.prepared.step is not None:
            return self.prepared.step(self.model, batch)[0]
        inputs, labels = batch
        return self.prepared.objective(self.model(inputs), labels)

    @property
    def seconds(self) -> float:
        """How long a quantity other than a step is timed."""
        return max(TIMED_SECONDS, self.window)

    def typical(self, samples: list[float]) -> float:
        """A call's typical seconds: the median, which a slow moment does not move; under a CPU quota the mean,
        as the calls that fell in the quota's pauses count as much as those that ran."""
        return float(np.mean(samples)) if self.window else _median(samples)

    def step(self, batch: int) -> list[float]:
        return timed(self.step_work(batch), seconds=max(TIMED_SECONDS / BLOCKS, self.window))

    def resume(self, batch: int) -> dict[float, float]:
        return resume_table(self.step_work(batch))

    def update(self) -> float:
        with torch.no_grad():
            return self.typical(timed(update_work(self.model, self.job.train.optimizer), seconds=self.seconds))

    def copy_per_byte(self) -> float:
        source = torch.randn(max(self.parameters, 1 << 18))
        target = torch.empty_like(source)
        return self.typical(timed(lambda: target.copy_(source), seconds=self.seconds)) / (source.numel() * 4)

    def evaluate_per_row(self) -> float:
        """Seconds per row of evaluation as the coordinator runs it (shoal.train.objective.evaluate): rows converted
        from their stored type, the forward pass, the loss and the metrics. The forward alone priced 100k uint8
        digit rows at 0.11 s where the job's evaluation took 0.37 s: their conversion costs more than the forward."""
        self.model.eval()
        with torch.no_grad():
            rows = self.evaluate_rows()
            features, labels = self.loader.features[:rows], self.loader.labels[:rows]
            step = self.prepared.evaluation_step

            def work() -> None:
                evaluate_rows(self.model, self.prepared.objective, step, features, labels, self.loader.to_tensors,
                              batch_size=rows)

            seconds = self.typical(timed(work, seconds=self.seconds, at_least=3))
        self.model.train()
        return seconds / rows

    def evaluate_rows(self) -> int:
        """As many rows as evaluation takes at once, or fewer where a forward over them would take over
        LARGEST_STEP, priced from one over EVALUATE_FEWEST rows (per row, a forward costs about the same from a
        few hundred rows up). Called in eval mode, under no_grad."""
        rows = min(self.loader.rows, EVALUATE_ROWS)
        fewest = min(rows, EVALUATE_FEWEST)
        batch = self.loader.to_tensors(self.loader.features[:fewest], self.loader.labels[:fewest])
        step = self.prepared.evaluation_step
        forward = (lambda: step(self.model, batch)) if step else (lambda: self.model(batch[0]))
        (seconds,) = timed(forward, seconds=0.0, at_least=1, warm_up=1)  # one call, after one
        return min(rows, max(fewest, int(LARGEST_STEP * fewest / max(seconds, 1e-9))))

    def measure(self, batches: list[int], startup: float, around_loop: tuple[float, ...] = ()) -> Compute:
        """Every batch size (above the job's, those ladder_round affords) timed in BLOCKS rounds apart in time,
        each round's mean kept, their median taken: a moment when the machine is slow spoils one round, not the
        answer. `around_loop`: the job's step as timed around the real loop, which shows with the rounds how far
        the machine's pace moved."""
        # with fewer rows than every batch, the job's batch is a step over all of them, timed as the job takes it
        usable = [batch for batch in batches if batch <= self.loader.rows] or [self.job.train.batch_size]
        own = self.job.train.batch_size if self.job.train.batch_size in usable else max(usable)
        first = ladder_round(self.step, usable, own)
        rounds = [first, *({batch: self.step(batch) for batch in first} for _ in range(BLOCKS - 1))]
        means = {batch: [float(np.mean(found[batch])) for found in rounds] for batch in first}
        timings = means[own] + list(around_loop if own == self.job.train.batch_size else ())
        return Compute(model=model_key(self.prepared.spec),
                       parameters=self.parameters, threads=self.threads,
                       step_seconds={batch: _median(means[batch]) for batch in first},
                       update_seconds=self.update(), copy_seconds_per_byte=self.copy_per_byte(),
                       evaluate_seconds_per_row=self.evaluate_per_row(),
                       load_rows_per_second=self.loader.rows / max(self.loader.load_seconds, 1e-9),
                       startup_seconds=startup, step_spread=pair_spread([t for found in rounds for t in found[own]]),
                       resume_seconds=self.resume(own), pace_range=slowest_over_fastest(timings))


def ladder_round(step, batches: list[int], own: int) -> dict[int, list[float]]:
    """One round of `step`'s timings over the batch sizes, smallest first. Above the job's own batch, a size whose
    step (the last timed one's fastest, scaled by size: a slow moment does not cut the ladder) would take over
    LARGEST_STEP is left out, and every size beyond it: a large model's batch of 4096 could take minutes, and
    more memory than the machine has, where the plan prices batches beyond the largest timed on the line
    through the two largest."""
    found: dict[int, list[float]] = {}
    for batch in sorted(batches):
        if batch > own and found:
            last = max(found)
            if min(found[last]) * batch / last > LARGEST_STEP:
                break
        found[batch] = step(batch)
    return found


GRADIENT_SCALE = 1e-2  # of the stand-in gradients: a trained model's order, far from float32's limits


def update_work(model: torch.nn.Module, options: dict):
    """The optimizer's step as a parameter server takes it, on a copy of `model` (the probe's own stays as it
    was). Its gradients are random, not zero: thousands of timed steps on zero gradients decay momentum
    toward subnormal floats, which x86 processors compute several times slower (SGD's step on 784-40-10
    read 0.45 ms that way against 0.066 ms)."""
    model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    for parameter in model.parameters():
        parameter.grad = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * GRADIENT_SCALE
    return make_optimizer(options, model).step


def _median(samples) -> float:
    return float(np.median(samples))


def model_key(spec: dict) -> str:
    """What a profile's compute was measured on: the model's description (layers, input, factory)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def batch_ladder(batch: int) -> list[int]:
    return sorted({*BATCH_LADDER, batch})


def measure_compute(job: JobConfig, threads: int) -> Compute:
    """The job's compute here with `threads` threads: the kernels probed in this process, and one short real
    job of the model, whose start-up is measured and whose steps scale the probed ones."""
    with ComputeProbe(job, threads) as probe:
        startup, factor, around = timed_loop(probe, job, threads)
        compute = probe.measure(batch_ladder(job.train.batch_size), startup, around)
    compute.loop_factors = {job.train.batch_size: factor}
    return compute


def with_loop_at(compute: Compute, job: JobConfig, threads: int) -> Compute:
    """`compute`, with the real loop's factor at the job's batch size measured (a short real job): the loop's
    share of a step differs from one batch size to another. A batch size the profile's ladder did not reach (a
    large model's) gains its probed step too, from the timings around the real loop."""
    batch = job.train.batch_size
    with ComputeProbe(job, threads) as probe:
        _, factor, around = timed_loop(probe, job, threads)
    return dataclasses.replace(compute, loop_factors={**compute.loop_factors, batch: factor},
                               step_seconds={batch: float(np.mean(around)), **compute.step_seconds},
                               pace_range=max(compute.pace_range, slowest_over_fastest(around)))


def timed_loop(probe: ComputeProbe, job: JobConfig, threads: int) -> tuple[float, float, tuple[float, float]]:
    """(the start-up of a short real job, its loop factor at the job's batch: the real loop's step over the
    probed one, and the probed step's two timings). The probed step is timed right before and right after the
    real job, so that a slow spell of the machine (minutes long on a VM) weighs on both sides of the ratio,
    not on the real job's alone (timed apart, three calibrations of one machine read 1.02, 1.67 and 1.29 at
    batch 128, their probed steps 0.68 to 0.69 ms)."""
    batch = job.train.batch_size
    before = probe.step(batch)
    startup, real_step = measure_loop(job, threads, loop_steps(float(np.mean(before)), probe.window))
    after = probe.step(batch)
    around = (float(np.mean(before)), float(np.mean(after)))
    return startup, loop_factor(real_step, float(np.mean(before + after))), around


def loop_factor(real_step: float, probed_step: float) -> float:
    """The real loop's step over the probed one (kept within 0.5-3: beyond, a measurement failed)."""
    return min(max(real_step / probed_step, 0.5), 3.0) if probed_step > 0 else 1.0


LOOP_STEPS = 100  # steps per epoch of the calibration job, at most
LOOP_FEWEST = 10  # and at least
LOOP_SECONDS = 2.0  # an epoch's probed length the steps are cut to, for a large model's long steps
LOOP_EPOCHS = 4  # the first warms up; the median of the others is kept


def loop_steps(probed_step: float, window: float = 0.0) -> int:
    """Steps per epoch of the calibration job: LOOP_STEPS, fewer (not under LOOP_FEWEST) where that many probed
    steps would take over LOOP_SECONDS. The loop's own work per step is what the job measures, and beside a step
    of 20 ms or more it is small: 100 steps of 0.23 s made the calibration job some 100 s of a 7-minute
    calibration. Under a CPU quota, as many more as make an epoch last `window` seconds (see least_window): the
    epoch's median is timed as the probed steps are."""
    if probed_step <= 0:
        return LOOP_STEPS
    steps = max(LOOP_FEWEST, min(LOOP_STEPS, int(LOOP_SECONDS / probed_step)))
    return max(steps, math.ceil(window / probed_step))


def loop_job(job: JobConfig, train: Path, threads: int) -> dict:
    """`job` as a one-worker job of LOOP_EPOCHS epochs on `train`: no test set (nor metrics, a stop rule or a
    validation split), checkpoints or algorithm; the user's step and transform are kept, as the job runs them."""
    loop = copy.deepcopy(job)
    loop.data.train, loop.data.test = str(train), None
    loop.train.epochs, loop.train.validate_every, loop.train.validate_seconds = LOOP_EPOCHS, 0, 0
    # what needs the test set or holds rows out goes with it: the loop times the steps on the rows it is given
    loop.train.metrics, loop.train.stop, loop.train.validation_split = None, None, 0.0
    loop.algorithm.name, loop.algorithm.options = "none", {}
    loop.checkpoint.every = 0
    loop.cluster.threads, loop.cluster.workers, loop.cluster.hosts, loop.cluster.groups = threads, 1, None, 1
    loop.output.progress = "none"
    return loop.to_dict()


def measure_loop(job: JobConfig, threads: int, steps: int = LOOP_STEPS) -> tuple[float, float]:
    """(seconds from `shoal train` to the first step, its data load left out; one step of the real training
    loop at the job's batch): a short one-worker job of the job's model, `steps` steps an epoch on rows drawn
    from its training set."""
    from shoal.data.derive import subset
    from shoal.data.format import open_dataset
    from shoal.events import DataLoaded, read_history

    with tempfile.TemporaryDirectory(prefix="shoal-plan-") as folder:
        folder = Path(folder)
        train_set = open_dataset(job.data.train)
        rows = steps * job.train.batch_size
        train = train_set.path if train_set.rows <= rows else subset(train_set, folder / "train", rows=rows).path
        (folder / "loop.toml").write_text(tomli_w.dumps(loop_job(job, train, threads)))
        began = time.time()
        subprocess.run([sys.executable, "-m", "shoal", "train", str(folder / "loop.toml"), "--run-dir",
                        str(folder / "run")], check=True, capture_output=True, timeout=600)
        history = read_history(folder / "run")
        loaded = history.last(DataLoaded)
        startup = history.start.time - began - (loaded.seconds if loaded else 0.0)
        later = _median([epoch.seconds for epoch in history.epochs[1:]])
        return startup, later / max(history.start.steps_per_epoch or 1, 1)
