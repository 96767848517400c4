"""Downpour's epoch time against batch size (mpi_learn's Table I).

Downpour with 4 training workers and its server (5 processes) trains cNeural's 784-40-10
sigmoid perceptron on synthetic digits at batch sizes 10, 100, 500 and 1000 per worker. Each
batch is one update through the server, so small batches spend their time on messages and
large ones on compute. Reported: training seconds per epoch (median over epochs after the
first), speedup relative to batch 100 (mpi_learn measured 0.1, 1.0, 3.0 and 4.1), updates per
second through the server, mean staleness, and the final test accuracy (the same epochs at a
larger batch mean fewer updates, so accuracy is the other side of the speedup).
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.algorithms import number, prepare_digits, train_once, write_job
from benchmarks.common import WORK, machine, machine_line, write_result

REFERENCE = 100
MPI_LEARN = {10: 0.1, 100: 1.0, 500: 3.0, 1000: 4.1}  # mpi_learn, Table I: speedup relative to batch 100


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=60_000, help="synthetic digits training rows")
    parser.add_argument("--test-rows", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=3, help="per run; the first is dropped from the times")
    parser.add_argument("--batches", default="10,100,500,1000", help="batch sizes per worker, comma-separated")
    parser.add_argument("--trainers", type=int, default=4, help="training workers (one more process serves)")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    reference = REFERENCE if REFERENCE in batches else batches[0]

    info = machine()
    train, test = prepare_digits(args.rows, args.test_rows)
    folder = WORK / "batch"
    processes = args.trainers + 1
    options = {"sync_every": 1, "synchronous": False}
    rows = []
    for batch in batches:
        job = write_job(folder / f"downpour-{batch}.toml", "digits", train, test, "downpour", options, args.epochs,
                        batch_size=batch)
        result = train_once(job, folder / f"run-{batch}-{time.time_ns()}", processes)
        row = {"batch": batch, **result}
        if "failed" not in result:
            # every trainer's batch is one update; per epoch, all trainers together send this many
            row["updates_per_second"] = result["updates"] / args.epochs / result["seconds_per_epoch"]
        rows.append(row)
        shown = result.get("failed") or (f"{result['seconds_per_epoch']:.2f} s/epoch, accuracy "
                                         f"{number(result['accuracy'])}, staleness {result['staleness_mean']:.2f}")
        print(f"batch {batch:5d}: {shown} [{result['wall_seconds']:.0f} s]", flush=True)

    base = next((r for r in rows if r["batch"] == reference and "failed" not in r), None)
    for row in rows:
        if base is not None and "failed" not in row:
            row["speedup"] = base["seconds_per_epoch"] / row["seconds_per_epoch"]

    def line(row: dict) -> str:
        published = MPI_LEARN.get(row["batch"])
        published = "-" if published is None else f"{published:.1f}"
        if "failed" in row:
            return f"| {row['batch']} | failed: {row['failed']} | - | - | - | - | {published} |"
        speedup = number(row.get("speedup"), 2)
        return (f"| {row['batch']} | {row['seconds_per_epoch']:.2f} | **{speedup}** | {row['updates_per_second']:,.0f} "
                f"| {row['staleness_mean']:.2f} | {number(row['accuracy'])} | {published} |")

    crowded = processes > info["cores"]
    warning = (f"\n**Warning:** {processes} processes on {info['cores']} cores: the trainers and the server share "
               "cores, so the times include contention between them.\n" if crowded else "")
    command = " ".join(["python -m benchmarks.batch", *(sys.argv[1:] if argv is None else argv)])
    total = sum(r["wall_seconds"] for r in rows)
    table = "\n".join(line(r) for r in rows)
    markdown = f"""# batch: Downpour's epoch time against batch size (mpi_learn's Table I)

Machine: {machine_line(info)}. Command: `{command}` ({total / 60:.1f} minutes).

Downpour (asynchronous, `sync_every = 1`: one update per batch) with {args.trainers} training workers
and the parameter server on rank 0: {processes} processes, cores / processes threads each (at least 1).
Data: {args.rows:,} synthetic digit rows (seed 1), {args.test_rows:,} test rows (seed 2); 784-40(sigmoid)-10,
SGD lr 0.1 momentum 0.5 on the server (cNeural's lr 0.5 momentum 0.9 diverges under stale updates),
the same at every batch size; {args.epochs} epoch(s) per run.
Seconds per epoch: training only, median over epochs after the first. Speedup: seconds per epoch at
batch {reference} divided by seconds per epoch at the batch. Updates per second: updates the server
applied per second of training. Accuracy: on the test set after the last epoch.
{warning}
| batch per worker | s / epoch | speedup vs {reference} | updates / s | mean staleness | accuracy | mpi_learn speedup |
| --- | --- | --- | --- | --- | --- | --- |
{table}
"""
    path = write_result("batch", markdown, {"machine": info, "arguments": vars(args), "reference": reference,
                                            "mpi_learn": MPI_LEARN, "rows": rows})
    print(markdown)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
