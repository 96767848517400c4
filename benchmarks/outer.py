"""Does averaging that talks rarely keep sync's accuracy? DiLoCo's outer optimizer against the plain mean and sync.

Averaging's rounds every `--period` steps (50 by default, ten times fewer exchanges than a step's) train
each worker alone between them; DiLoCo (`algorithm.outer`, Nesterov momentum, outer lr 0.7, momentum 0.9)
applies each round's mean change as a gradient instead of taking the mean. Per task of benchmarks/algorithms.py
(UCI Adult from ../shared/data/a9a with the Parallel SGD paper's model, when that folder exists, and
synthetic digits with cNeural's perceptron), each of these trains the same epochs on `--workers` local
workers, once per seed (`train.seed`: the weights' start and the shuffles):

- sync: the gradients averaged every step (the accuracy to keep);
- averaging: the plain mean every `--period` steps;
- averaging + outer: the same rounds with the outer optimizer;
- averaging once an epoch + outer: the rarest rounds.

Reported per task: each variant's test accuracy per seed, its mean and its difference from sync's mean in
points; the issue's goal is averaging + outer within 0.5 points of sync at equal epochs. Accuracy does not
depend on the link, so the workers run on this machine (no emulated hosts). Results go to
benchmarks/results/*-outer.md and .json.

    .venv/bin/python -m benchmarks.outer              # about 10 minutes on 2 cores
    .venv/bin/python -m benchmarks.outer --quick      # a smoke run: digits only, few rows, one seed
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time

from benchmarks.algorithms import prepare_a9a, prepare_digits, train_once, write_job
from benchmarks.common import WORK, machine, machine_line, write_result

OUTER = {"name": "nesterov", "lr": 0.7, "momentum": 0.9}
GOAL_POINTS = 0.5


def variants(period: int) -> dict[str, tuple[str, dict]]:
    """Each variant's name -> (algorithm, its options)."""
    return {"sync": ("sync", {}),
            f"averaging every {period} steps": ("averaging", {"period": period}),
            f"averaging every {period} steps + outer": ("averaging", {"period": period, "outer": OUTER}),
            "averaging once an epoch + outer": ("averaging", {"period": "epoch", "outer": OUTER})}


def outer_line(options: dict) -> str:
    """`algorithm.outer` as a TOML line (benchmarks/algorithms.py's job writer takes plain values only)."""
    table = options.get("outer")
    return "" if table is None else "outer = { " + ", ".join(
        f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value}" for key, value in table.items()) + " }\n"


def tasks(args: argparse.Namespace) -> dict:
    found = {"digits": prepare_digits(args.digits_rows, args.test_rows)}
    if not args.quick:
        a9a = prepare_a9a()
        if a9a is not None:
            found["a9a"] = a9a
    return found


def run_task(task: str, paths, args: argparse.Namespace) -> dict:
    """Every variant, every seed, interleaved by seed; each run's accuracy."""
    results = {name: [] for name in variants(args.period)}
    for seed in args.seeds:
        for name, (algorithm, options) in variants(args.period).items():
            slug = name.replace(" ", "-").replace("+", "plus")
            plain = {key: value for key, value in options.items() if key != "outer"}
            job = write_job(WORK / "outer" / f"{task}-{slug}-{seed}.toml", task, *paths, algorithm, plain, args.epochs)
            text = job.read_text().replace("seed = 0\n", f"seed = {seed}\n")
            job.write_text(text.replace(f'name = "{algorithm}"\n', f'name = "{algorithm}"\n{outer_line(options)}', 1))
            run = train_once(job, WORK / "outer" / f"{task}-{slug}-{seed}", args.workers)
            results[name].append(run)
            said = run.get("failed") or f"accuracy {run['accuracy']:.4f}"
            print(f"{task} seed {seed} {name}: {said}", flush=True)
    return results


def summary(results: dict) -> dict:
    accuracies = {name: [run.get("accuracy") for run in runs] for name, runs in results.items()}
    means = {name: statistics.mean(values) if values and None not in values else None
             for name, values in accuracies.items()}
    sync = means.get("sync")
    return {name: {"accuracies": accuracies[name], "mean": means[name],
                   "points_from_sync": None if sync is None or means[name] is None else 100 * (means[name] - sync)}
            for name in results}


def section(task: str, found: dict, args: argparse.Namespace) -> str:
    lines = [f"## {task}", "", "| variant | accuracy per seed | mean | points from sync |",
             "| --- | --- | ---: | ---: |"]
    for name, row in found.items():
        each = ", ".join("failed" if value is None else f"{value:.4f}" for value in row["accuracies"])
        mean = "—" if row["mean"] is None else f"{row['mean']:.4f}"
        points = "—" if row["points_from_sync"] is None else f"{row['points_from_sync']:+.2f}"
        lines.append(f"| {name} | {each} | {mean} | {points} |")
    outer = found.get(f"averaging every {args.period} steps + outer", {}).get("points_from_sync")
    verdict = "not measured" if outer is None else ("met" if outer >= -GOAL_POINTS else "**missed**")
    lines += ["", f"- averaging every {args.period} steps + outer within {GOAL_POINTS} points of sync: "
                  f"{'—' if outer is None else f'{outer:+.2f}'} points: {verdict}", ""]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--period", type=int, default=50, help="steps between averaging's rounds")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated train.seed values")
    parser.add_argument("--digits-rows", type=int, default=20_000)
    parser.add_argument("--test-rows", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    args.seeds = [int(seed) for seed in args.seeds.split(",")]
    if args.quick:
        args.seeds, args.epochs, args.digits_rows, args.test_rows = args.seeds[:1], 2, 2_000, 1_000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    began = time.monotonic()
    sections, data = [], {"machine": machine(), "argv": sys.argv[1:], "tasks": {}}
    shutil.rmtree(WORK / "outer", ignore_errors=True)  # this benchmark's own runs, from an earlier run
    for task, paths in tasks(args).items():
        found = summary(run_task(task, paths, args))
        data["tasks"][task] = found
        sections.append(section(task, found, args))
    minutes = (time.monotonic() - began) / 60
    text = "\n".join([
        "# Averaging that talks rarely: DiLoCo's outer optimizer against the plain mean and sync", "",
        machine_line(), f"{args.workers} workers on this machine, {args.epochs} epochs, seeds "
        f"{', '.join(map(str, args.seeds))}; outer: Nesterov, lr {OUTER['lr']}, momentum {OUTER['momentum']}. "
        f"Tasks and models as benchmarks/algorithms.py. `{' '.join(['python -m benchmarks.outer', *sys.argv[1:]])}` "
        f"({minutes:.1f} minutes).", "", *sections])
    print(text)
    print(f"written: {write_result('outer', text, data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
