"""mpi_learn's Table I at its 20 workers: Downpour's epoch time against batch size.

mpi_learn trains with 20 workers at batches of 10, 100, 500 and 1000 and reports the speedup against batch 100
(0.1, 1.0, 3.0, 4.1): each batch is one update through the master, so small batches wait on messages and
large ones compute. benchmarks/batch.py measured this with 4 trainers on one machine; here
examples/sequences-lstm.toml (mpi_learn's LSTM(20) + softmax(3)) trains with Downpour on the emulated cluster
of 21 hosts dilated by D = 11 (tests/cluster/hosts.py: each host 1/11 of a core and of a 1 Gbit/s link): the
server on host0 and one trainer on each of the other 20. Per batch size: the median epoch over the later half
of the epochs (seconds divided by D), the speedup against batch 100 and the test accuracy after the last epoch
(the same epochs at a larger batch make fewer updates).

    .venv/bin/python -m benchmarks.seeds_mpi_learn_batch     # about 20 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.cluster.hosts import EmulatedCluster

from benchmarks.common import machine, machine_line, require_cluster, write_result
from benchmarks.seeds_mpi_learn import make_data, train, write_job

TRAINERS = 20
MPI_LEARN = {10: 0.1, 100: 1.0, 500: 3.0, 1000: 4.1}  # mpi_learn, Table I: speedup against batch 100
FOUR_TRAINERS = {10: 0.16, 100: 1.0, 500: 4.77, 1000: 7.66}  # benchmarks/results/2026-11-22-2core-cpu-batch.md
REFERENCE = 100


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64_000, help="at least 3 batches of 1000 for each trainer")
    parser.add_argument("--batches", default="10,100,500,1000")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dilation", type=int, default=11)
    args = parser.parse_args(argv)
    require_cluster("benchmarks.seeds_mpi_learn_batch", TRAINERS + 1, args.dilation)
    train_data, test_data = make_data(args.rows)
    began = time.monotonic()
    runs = []
    with EmulatedCluster(hosts=TRAINERS + 1, rate="1gbit", dilation=args.dilation) as cluster:
        for batch in (int(size) for size in args.batches.split(",")):
            job = write_job(cluster.shared, train_data, test_data, args.epochs, 0, args.dilation, batch_size=batch)
            runs.append({**train(cluster, job, TRAINERS, f"batch-{batch}", args.dilation), "batch": batch})
            print(runs[-1], flush=True)
    reference = next(run for run in runs if run["batch"] == REFERENCE)["epoch_seconds"]
    lines = ["| batch per trainer | epoch s (/ D) | speedup vs 100 | test accuracy | mpi_learn (20 workers) | "
             "shoal, 4 trainers on one machine, the 784-40-10 perceptron (2026-11-22) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run in runs:
        run["speedup"] = reference / run["epoch_seconds"]
        lines.append(f"| {run['batch']} | {run['epoch_seconds']:.2f} | **{run['speedup']:.2f}** | "
                     f"{run['accuracy']:.3f} | {MPI_LEARN.get(run['batch'], '')} | "
                     f"{FOUR_TRAINERS.get(run['batch'], '')} |")
    info = machine()
    markdown = f"""# mpi_learn's Table I beside shoal: Downpour at 20 trainers against batch size

{machine_line(info)}. examples/sequences-lstm.toml (LSTM(20) + softmax(3), Downpour, Adam) on {args.rows:,} rows
of `shoal data synth sequences` (test: 20,000 rows of another seed), {args.epochs} epochs per batch size; the
emulated cluster of {TRAINERS + 1} hosts dilated by D = {args.dilation} (1/{args.dilation} of a core and of a
1 Gbit/s link each, a keeper on each core), the server on host0 and one trainer on each other host. Epoch: the
median of the later half of the epochs, divided by D. `python -m benchmarks.seeds_mpi_learn_batch`
({(time.monotonic() - began) / 60:.0f} minutes).

{chr(10).join(lines)}
"""
    path = write_result("seeds-mpi-learn-batch", markdown, {"machine": info, "arguments": vars(args), "runs": runs})
    print(markdown)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
