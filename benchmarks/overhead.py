"""Overhead: shoal with one worker against a hand-written PyTorch loop doing the same work.

Same model (the Parallel SGD paper's 123-100-2 with dropout), same rows in memory, batch
size, optimizer (Adam) and threads; shoal's epoch time is read from its events (training
only), the loop's is measured around its epoch. Target: ratio <= 1.05.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from benchmarks.common import ROOT, WORK, epoch_seconds, machine, machine_line, median, shoal_train, write_result
from shoal.data.format import open_dataset
from shoal.data.synthetic import synth_binary

FEATURES = 123


def hand_written_epochs(features: np.ndarray, labels: np.ndarray, batch: int, epochs: int, threads: int) -> list:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 100), nn.ReLU(), nn.Dropout(0.5), nn.Linear(100, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001, eps=1e-8)
    generator = np.random.default_rng(0)
    seconds = []
    for _ in range(epochs):
        began = time.perf_counter()
        order = generator.permutation(len(features))
        for start in range(0, len(order), batch):
            index = order[start : start + batch]
            inputs = torch.from_numpy(features[index])
            targets = torch.from_numpy(labels[index])
            optimizer.zero_grad(set_to_none=True)
            loss = functional.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            loss.item()
        seconds.append(time.perf_counter() - began)
    return seconds


def hand_written_in_fresh_process(path: Path, batch: int, epochs: int, threads: int) -> list[float]:
    """The loop in its own process with the environment shoal's worker gets, so neither side inherits
    the other's warm caches or the generator's idle BLAS threads."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    finished = subprocess.run([sys.executable, "-m", "benchmarks.overhead", "--loop-only", str(path),
                               "--batch", str(batch), "--epochs", str(epochs), "--threads", str(threads)],
                              check=True, capture_output=True, text=True, env=env, cwd=ROOT)
    return json.loads(finished.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--loop-only", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="alternate shoal and the loop this many times")
    args = parser.parse_args(argv)
    if args.loop_only:
        features, labels = open_dataset(str(args.loop_only)).read_all()
        print(json.dumps(hand_written_epochs(features, labels, args.batch, args.epochs, args.threads)))
        return

    folder = WORK / "overhead"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    synth_binary(folder / "train", args.rows, features=FEATURES, seed=1)
    job = folder / "job.toml"
    job.write_text(f"""
[model]
layers = [{{ dense = 100, activation = "relu" }}, {{ dropout = 0.5 }}, {{ dense = 2 }}]
[data]
train = "{folder / 'train'}"
[algorithm]
name = "none"
[train]
epochs = {args.epochs}
batch_size = {args.batch}
optimizer = {{ name = "adam", lr = 0.001, eps = 1e-8 }}
[cluster]
threads = {args.threads}
""")
    shoal_times, loop_times = [], []
    for round_number in range(args.rounds):  # interleaved, so drift in the machine hits both
        history = shoal_train(job, folder / f"run{round_number}", "--workers", "1")
        shoal_times += epoch_seconds(history)
        loop_times += hand_written_in_fresh_process(folder / "train", args.batch, args.epochs, args.threads)[1:]
    shoal_median, loop_median = median(shoal_times), median(loop_times)
    ratio = shoal_median / loop_median
    info = machine()
    markdown = f"""# overhead: shoal (1 worker) against a hand-written PyTorch loop

Machine: {machine_line(info)}.
Workload: {args.rows:,} rows x {FEATURES} float32 features in memory, 123-100(relu)-dropout-2, Adam,
batch {args.batch}, {args.threads} threads, {args.epochs} epochs per run (the first dropped as warm-up),
{args.rounds} interleaved runs of each, each in a fresh process with OMP_NUM_THREADS={args.threads}.
Command: `python -m benchmarks.overhead`.

| | median epoch (s) | epochs timed |
| --- | --- | --- |
| hand-written loop | {loop_median:.3f} | {', '.join(f'{t:.3f}' for t in loop_times)} |
| shoal, 1 worker | {shoal_median:.3f} | {', '.join(f'{t:.3f}' for t in shoal_times)} |

**Ratio shoal / loop: {ratio:.3f}** (target <= 1.05).
"""
    path = write_result("overhead", markdown, {"machine": info, "shoal": shoal_times, "loop": loop_times,
                                               "ratio": ratio, "arguments": vars(args)})
    print(markdown)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
