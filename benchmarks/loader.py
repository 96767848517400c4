"""Loader speed: batches per second from memory and from the local cache, and time to load a share.

Batches per second of `ShardLoader` over one shuffled epoch of 1,000,000 x 784 uint8 rows,
held in memory and, with a memory budget of a quarter of the share, read from the
memory-mapped cache in sub-partitions, against a plain NumPy loop over the same array that
does the same work per batch (a fancy index by a permutation, conversion to float32 tensors
scaled to [0, 1], labels to int64). Target: the loader within 10% of the plain loop.
Then the seconds to load the whole dataset as one worker, and as two workers loading their
halves at the same time (separate processes, wall time of the slower).
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import time

import numpy as np
import torch

from benchmarks.common import WORK, machine, machine_line, median, write_result
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.data.synthetic import synth_digits


def plain_epoch(features: np.ndarray, labels: np.ndarray, batch: int, seed: int) -> int:
    """The baseline: what any hand-written loop over one array in memory does per batch."""
    order = np.random.default_rng(seed).permutation(len(features))
    count = 0
    for lo in range(0, len(features), batch):
        index = order[lo : lo + batch]
        inputs = torch.from_numpy(features[index]).float().mul_(1 / 255)
        targets = torch.from_numpy(labels[index]).to(torch.int64)
        count += min(len(inputs), len(targets))
    return count


def loader_epoch(loader: ShardLoader, epoch: int) -> int:
    return sum(len(inputs) for inputs, _ in loader.batches(epoch))


def load_share(path: str, rank: int, world_size: int, queue) -> None:
    torch.set_num_threads(1)
    began = time.perf_counter()
    loader = ShardLoader(open_dataset(path), rank=rank, world_size=world_size, batch_size=128, seed=0)
    queue.put((rank, time.perf_counter() - began, loader.rows))


def timed_load(path: str, world_size: int) -> float:
    """Wall seconds until every one of `world_size` fresh processes holds its share."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=load_share, args=(path, rank, world_size, queue)) for rank in range(world_size)]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert sum(rows for _, _, rows in results) == open_dataset(path).rows
    return max(seconds for _, seconds, _ in results)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    folder = WORK / "loader"
    train = folder / f"digits-{args.rows}"
    if not train.exists():
        synth_digits(str(train), args.rows, seed=1)
    dataset = open_dataset(str(train))
    share_bytes = dataset.rows * (dataset.features + 8)

    memory = ShardLoader(dataset, rank=0, world_size=1, batch_size=args.batch, seed=0)
    cache_dir = folder / "cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    cached = ShardLoader(open_dataset(str(train)), rank=0, world_size=1, batch_size=args.batch, seed=0,
                         memory_budget=share_bytes // 4, cache_dir=str(cache_dir))
    features, labels = memory.features.reshape(dataset.rows, -1), memory.labels
    runs = {"plain NumPy loop": lambda epoch: plain_epoch(features, labels, args.batch, epoch),
            "loader, memory": lambda epoch: loader_epoch(memory, epoch),
            "loader, cache (budget 1/4)": lambda epoch: loader_epoch(cached, epoch)}
    timings: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(args.rounds):
        for name, run in runs.items():
            began = time.perf_counter()
            rows = run(round_)
            timings[name].append(time.perf_counter() - began)
            assert rows == dataset.rows
            print(f"round {round_}  {name:28s} {timings[name][-1]:6.2f} s", flush=True)
    batches = -(-dataset.rows // args.batch)
    rates = {name: batches / median(seconds) for name, seconds in timings.items()}
    describe = cached.describe()
    cached.close()

    load = {workers: timed_load(str(train), workers) for workers in (1, 2)}
    info = machine()
    baseline = rates["plain NumPy loop"]
    table = "\n".join(f"| {name} | {rate:,.0f} | {rate / baseline:.3f} |" for name, rate in rates.items())
    markdown = f"""# loader: batches per second, and time to load {dataset.rows:,} x 784 uint8 rows

Machine: {machine_line(info)}. One thread. Command: `python -m benchmarks.loader`.
Batch {args.batch}, one shuffled epoch per measurement, {args.rounds} interleaved rounds, median.
The cache run has a memory budget of a quarter of the share: {describe['sub_partitions']} sub-partitions of
{describe['rows_per_sub_partition']:,} rows, memory-mapped from a local file.

| source | batches / s | vs plain loop |
| --- | --- | --- |
{table}

Target: the loader within 10% of the plain loop (ratio >= 0.90).

| workers loading at once | seconds (slowest worker) |
| --- | --- |
| 1 | {load[1]:.2f} |
| 2 | {load[2]:.2f} |
"""
    path = write_result("loader", markdown, {"machine": info, "rates": rates, "timings": timings,
                                             "load_seconds": load, "arguments": vars(args), "cache": describe})
    print(markdown)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
