"""Epoch time under a memory budget: a job whose budget is a quarter of each worker's share.

cNeural's 784-40-10 workload on 1,000,000 digit rows, 2 workers x 1 thread, averaging, batch
1024. The same job runs unbudgeted (each share in memory) and with `data.memory_per_worker`
set to a quarter of the share (each share cached on local disk, trained on in sub-partitions),
alternating, so that drifts of this machine's speed fall on both. Target: budgeted / unbudgeted
epoch time <= 1.15. Also reported: load time, and each worker's peak memory above what it
held before loading its data.
"""

from __future__ import annotations

import argparse
import time

from benchmarks.common import WORK, epoch_seconds, machine, machine_line, median, shoal_train, write_result
from shoal.data.synthetic import synth_digits
from shoal.events import DataLoaded


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=4, help="per run; the first is dropped as warm-up")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each setting")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    folder = WORK / "budget"
    train = folder / f"digits-{args.rows}"
    if not train.exists():
        synth_digits(str(train), args.rows, seed=1)
    share_bytes = -(-args.rows // args.workers) * (784 + 8)
    budget = share_bytes // 4
    job = folder / "job.toml"
    job.write_text(f"""
[model]
input = [784]
layers = [{{ dense = 40, activation = "sigmoid" }}, {{ dense = 10 }}]
[data]
train = "{train}"
[algorithm]
name = "averaging"
[train]
epochs = {args.epochs}
batch_size = 1024
optimizer = {{ name = "sgd", lr = 0.5, momentum = 0.9 }}
[checkpoint]
every = 0
""")
    settings = {"unbudgeted": [], "budget 1/4 of the share": ["--set", f"data.memory_per_worker={budget}"]}
    results: dict[str, dict[str, list]] = {name: {"epoch": [], "load": [], "added": [], "loss": []}
                                           for name in settings}
    for round_ in range(args.rounds):
        for name, options in settings.items():
            run_dir = folder / f"run-{round_}-{len(options)}-{time.time_ns()}"
            history = shoal_train(job, run_dir, "--workers", str(args.workers), "--set", "cluster.threads=1",
                                  *options)
            seconds = epoch_seconds(history)
            results[name]["epoch"] += seconds
            results[name]["load"].append(history.last(DataLoaded).seconds)
            results[name]["added"].append(max(m.peak - m.before_data for m in history.end.memory))
            results[name]["loss"].append(history.epochs[-1].train_loss)
            print(f"round {round_}  {name:26s} epochs {[round(s, 2) for s in seconds]}", flush=True)

    plain, budgeted = (median(results[name]["epoch"]) for name in settings)
    info = machine()
    table = "\n".join(
        f"| {name} | {median(r['epoch']):.2f} | {min(r['epoch']):.2f}-{max(r['epoch']):.2f} | "
        f"{median(r['load']):.2f} | {max(r['added']) / 1e6:.0f} | {r['loss'][-1]:.4f} |"
        for name, r in results.items())
    markdown = f"""# budget: epoch time with a memory budget of a quarter of the share

Machine: {machine_line(info)}. Command: `python -m benchmarks.budget`.
{args.rows:,} synthetic digit rows, 784-40-10 sigmoid perceptron, {args.workers} workers x 1 thread, averaging,
batch 1024, {args.epochs} epochs per run (first dropped), {args.rounds} alternating rounds.
Share per worker {share_bytes / 1e6:.0f} MB (features + labels); budget {budget / 1e6:.0f} MB.

| setting | s / epoch (median) | range | load s | peak MB added per worker | last train loss |
| --- | --- | --- | --- | --- | --- |
{table}

Budgeted / unbudgeted epoch time: **{budgeted / plain:.3f}** (target <= 1.15).
"""
    path = write_result("budget", markdown, {"machine": info, "results": results, "budget": budget,
                                             "share_bytes": share_bytes, "arguments": vars(args)})
    print(markdown)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
