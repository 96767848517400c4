"""What the user's own code costs a worker: a training step in place of shoal's loss, and a transform per batch.

One worker, in process (shoal's training loop, a one-rank communicator), the Parallel SGD paper's
123-100-2 model with dropout and Adam on 60,000 synthetic rows in memory, batch 128, one thread.
Each variant's epochs are timed (the first of each run left out), the variants interleaved, and
each run's median compared with the built-in loss's in the same run (this machine's pace moves by
a third over minutes):

- step: `step(model, batch)` computing the same cross-entropy (goal: within 2% of the built-in loop);
- step + no-op transform: the transform's own cost (saving, seeding and restoring the generators);
- step + noise: a transform that draws (torch.randn_like) every batch, as augmentation does.

    .venv/bin/python -m benchmarks.own_code [--rows 60000] [--runs 9]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.nn import functional

from benchmarks.common import WORK, machine, machine_line, median, write_result
from shoal.algorithms import make_algorithm
from shoal.cluster.collectives import Communicator
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.data.synthetic import synth_binary
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from shoal.train.step import Step
from shoal.train.transform import Transform

FEATURES, BATCH, EPOCHS = 123, 128, 4


def cross_entropy_step(model, batch):
    inputs, labels = batch
    return functional.cross_entropy(model(inputs), labels)


def unchanged(batch):
    return batch


def noise(batch):
    inputs, labels = batch
    return inputs + 0.01 * torch.randn_like(inputs), labels


VARIANTS = {
    "built-in loss": (None, None),
    "step": (cross_entropy_step, None),
    "step + no-op transform": (cross_entropy_step, unchanged),
    "step + noise transform": (cross_entropy_step, noise),
}


def epochs_of(dataset, step, transform) -> list[float]:
    """Seconds of each epoch after the first, one variant, in this process."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 100), nn.ReLU(), nn.Dropout(0.5), nn.Linear(100, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    comm = Communicator(0, 1)
    algorithm = make_algorithm("none", {})
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(dataset, rank=0, world_size=1, batch_size=BATCH, seed=0)
    trainer = Trainer(model, optimizer, Objective("cross_entropy", 2), algorithm, loader, comm,
                      step=Step(step) if step else None, transform=Transform(transform, 0, 0) if transform else None)
    seconds = []
    for epoch in range(EPOCHS):
        began = time.perf_counter()
        trainer.train_epoch(epoch)
        seconds.append(time.perf_counter() - began)
    loader.close()
    return seconds[1:]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    path = WORK / f"own-code-{args.rows}"
    if not (path / "meta.json").exists():
        synth_binary(str(path), args.rows, features=FEATURES, seed=1, overwrite=True)
    dataset = open_dataset(str(path))
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for step, transform in VARIANTS.values():  # a run of each first, untimed: imports, allocator, caches
        epochs_of(dataset, step, transform)
    ratios: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.runs):
        run = {name: epochs_of(dataset, step, transform) for name, (step, transform) in VARIANTS.items()}
        for name, seconds in run.items():  # against the built-in loss of the same run: the machine's pace moves
            times[name] += seconds
            ratios[name].append(median(seconds) / median(run["built-in loss"]))
    steps = -(-args.rows // BATCH)
    base = median(times["built-in loss"])
    rows = [f"| {name} | {median(times[name]):.3f} | {median(ratios[name]):.3f} "
            f"({min(ratios[name]):.2f} to {max(ratios[name]):.2f}) | "
            f"{(median(ratios[name]) - 1) * base / steps * 1e6:+.0f} |" for name in VARIANTS]
    markdown = "\n".join([
        "# the user's own code: a training step and a transform per batch", "",
        f"Machine: {machine_line()}.",
        f"Workload: {args.rows:,} rows x {FEATURES}, 123-100-2 with dropout, Adam, batch {BATCH}, one worker in "
        f"process, one thread; {args.runs} runs of {EPOCHS} epochs of each variant, interleaved (the first epoch "
        f"of each left out). Command: `python -m benchmarks.own_code --rows {args.rows} --runs {args.runs}`.", "",
        "| variant | median epoch (s) | against the built-in loss of the same run: median (range) | per step (µs) |",
        "| --- | ---: | ---: | ---: |", *rows, "", "Goal: the step within 1.02 of the built-in loss."])
    path = write_result("own-code", markdown, {"machine": machine(), "seconds": times, "ratios": ratios,
                                               "rows": args.rows})
    print(markdown)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
