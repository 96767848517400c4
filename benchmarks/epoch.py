"""Epoch time on cNeural's workload: a 784-40-10 sigmoid perceptron on 1,000,000 digit rows.

Seconds per epoch for 1 worker x 2 threads, 2 workers x 1 thread (sync and averaging) and
1 worker x 1 thread, at batch 128 and 1024, against the machine's compute floor measured in
the same run: a plain PyTorch pass computing the gradient over all rows in chunks of 10,000
with 2 threads. Published anchors: 36.3 s per epoch on one 8-core machine (cNeural), 784 s
with Hadoop MapReduce. Targets: averaging with 2 workers x 1 thread at batch 1024 within
1.3x of the floor; 2 workers x 1 thread with averaging at least 1.8x faster than 1 x 1.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.nn import functional

from benchmarks.common import WORK, epoch_seconds, machine, machine_line, median, shoal_train, write_result
from shoal.data.format import open_dataset
from shoal.data.synthetic import synth_digits

# (label, workers, threads, algorithm)
LAYOUTS = [
    ("1 worker x 1 thread", 1, 1, "none"),
    ("1 worker x 2 threads", 1, 2, "none"),
    ("2 workers x 1 thread, sync", 2, 1, "sync"),
    ("2 workers x 1 thread, averaging", 2, 1, "averaging"),
]


def compute_floor(path: str, threads: int, chunk: int = 10_000, passes: int = 3) -> float:
    """Seconds per million rows for forward + backward over every row, nothing else."""
    torch.set_num_threads(threads)
    features, labels = open_dataset(path).read_all()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 40), nn.Sigmoid(), nn.Linear(40, 10))
    best = float("inf")
    for _ in range(passes):
        began = time.perf_counter()
        for start in range(0, len(features), chunk):
            inputs = torch.from_numpy(features[start : start + chunk]).float().mul_(1 / 255).reshape(-1, 784)
            loss = functional.cross_entropy(model(inputs), torch.from_numpy(labels[start : start + chunk]))
            loss.backward()
        best = min(best, time.perf_counter() - began)
    return best * 1_000_000 / len(features)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=3, help="per run; the first is dropped as warm-up")
    parser.add_argument("--batches", default="128,1024")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]

    folder = WORK / "epoch"
    train = folder / f"digits-{args.rows}"
    if not train.exists():
        synth_digits(train, args.rows, seed=1)
    floor = compute_floor(str(train), threads=2)
    job = folder / "job.toml"
    job.write_text(f"""
[model]
input = [784]
layers = [{{ dense = 40, activation = "sigmoid" }}, {{ dense = 10 }}]
[data]
train = "{train}"
[train]
epochs = {args.epochs}
optimizer = {{ name = "sgd", lr = 0.5, momentum = 0.9 }}
""")
    rows = []
    for batch in batches:
        for label, workers, threads, algorithm in LAYOUTS:
            run_dir = folder / f"run-{batch}-{workers}x{threads}-{algorithm}-{time.time_ns()}"
            history = shoal_train(job, run_dir, "--workers", str(workers), "--set", f"cluster.threads={threads}",
                                  "--set", f"algorithm.name='{algorithm}'", "--set", f"train.batch_size={batch}")
            seconds = median(epoch_seconds(history)) * 1_000_000 / args.rows
            final = history.epochs[-1]
            rows.append({"batch": batch, "layout": label, "workers": workers, "threads": threads,
                         "algorithm": algorithm, "seconds_per_million": seconds,
                         "communication": final.seconds_split.communication, "train_loss": final.train_loss})
            print(f"batch {batch:5d}  {label:34s} {seconds:7.2f} s per epoch of 1M rows", flush=True)

    def find(batch, label):
        return next(r["seconds_per_million"] for r in rows if r["batch"] == batch and r["layout"] == label)

    largest = max(batches)
    averaging = find(largest, "2 workers x 1 thread, averaging")
    single = find(largest, "1 worker x 1 thread")
    table = "\n".join(
        f"| {r['batch']} | {r['layout']} | {r['seconds_per_million']:.2f} | {r['seconds_per_million'] / floor:.2f} "
        f"| {r['communication']:.2f} | {r['train_loss']:.4f} |" for r in rows)
    info = machine()
    markdown = f"""# epoch: cNeural's 784-40-10 workload, seconds per epoch of 1,000,000 rows

Machine: {machine_line(info)}.
Data: {args.rows:,} synthetic MNIST-shaped uint8 rows (`shoal data synth digits`), SGD momentum 0.9,
{args.epochs} epochs per run, median of all but the first. Command: `python -m benchmarks.epoch`.

Compute floor (forward + backward over all rows in chunks of 10,000, 2 threads, best of 3):
**{floor:.2f} s per million rows**.

| batch | layout | s / epoch (1M rows) | x floor | communication (s, last epoch, mean per worker) | train loss |
| --- | --- | --- | --- | --- | --- |
{table}

- Averaging, 2 workers x 1 thread, batch {largest}: **{averaging / floor:.2f}x the floor** (target <= 1.3).
- 2 workers x 1 thread averaging against 1 worker x 1 thread, batch {largest}: **{single / averaging:.2f}x faster**
  (target >= 1.8).
- Published anchors: cNeural 36.3 s per epoch on one 8-core machine; Hadoop MapReduce 784 s.
"""
    path = write_result("epoch", markdown, {"machine": info, "floor": floor, "rows": rows, "arguments": vars(args)})
    print(markdown)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
