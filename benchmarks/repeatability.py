"""Repeatability: how far the same job's epoch time moves from one run to the next on this machine.

No prediction can come closer to a measurement than the measurement comes to itself. The plan's
validation (`benchmarks.plan`) compares a prediction with a job's run minutes later; this script
runs the same one-worker jobs (its 1-host rows: MNIST-shaped digits, 784-40-10 and 784-256-10,
SGD with momentum, one thread pinned to one core) several times, interleaved so that the
machine's slow spells fall on every job alike, and reports each run's epoch (the mean of the
epochs after the first, as the validation measures it) against the job's median run, and how far the
epochs of one run move from each other: a machine whose speed changes within seconds moves a run's
epochs, and a calibration taken seconds apart, alike.

    python -m benchmarks.repeatability [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks.common import WORK, epoch_seconds, machine, machine_line, write_result
from benchmarks.plan import GOAL, MEASURED_SECONDS, epochs_for, write_job
from shoal.data.synthetic import synth_digits
from shoal.events import read_history

ROWS = 100_000  # the plan validation's 1 Gbit/s data
JOBS = (("784-40-10", 128), ("784-40-10", 1024), ("784-256-10", 128), ("784-256-10", 1024))
CORE = 1  # the emulated cluster's second host's core; nothing else runs on it here


def one_run(job, run_dir) -> list[float]:
    """The run's epochs after the first, its one worker pinned to CORE."""
    shutil.rmtree(run_dir, ignore_errors=True)
    subprocess.run(["taskset", "-c", str(CORE), sys.executable, "-m", "shoal", "train", str(job), "--workers", "1",
                    "--run-dir", str(run_dir)], check=True, capture_output=True, timeout=900)
    return epoch_seconds(read_history(run_dir))


def job_files(folder) -> dict:
    """Each job written with enough epochs that those measured add up to MEASURED_SECONDS (by a first run)."""
    train = WORK / f"digits-{ROWS}"
    if not train.exists():
        synth_digits(str(train), ROWS, seed=1)
    jobs = {}
    for model, batch in JOBS:
        job = write_job(folder, train, model, "sync", batch, "ssh")
        epoch = statistics.mean(one_run(job, folder / "sizing"))
        jobs[(model, batch)] = write_job(folder, train, model, "sync", batch, "ssh", epochs_for(epoch))
    return jobs


def summary(model: str, batch: int, epochs: list[list[float]]) -> dict:
    """A job's runs (each the mean of its epochs) against their median, and how far epochs of one run moved."""
    runs = [statistics.mean(run) for run in epochs]
    middle = statistics.median(runs)
    deviations = [run / middle - 1 for run in runs]
    return {"model": model, "batch": batch, "runs": runs, "median": middle,
            "largest_deviation": max(deviations, key=abs), "within_goal": sum(abs(d) <= GOAL for d in deviations),
            "spread": max(runs) / min(runs), "epochs": epochs,
            "spread_within_run": max(max(run) / min(run) for run in epochs)}


def report(rows: list[dict], args, seconds: float, info: dict) -> str:
    within = sum(row["within_goal"] for row in rows)
    total = sum(len(row["runs"]) for row in rows)
    lines = [
        "# Repeatability: the same job's epoch time from one run to the next", "",
        f"{machine_line(info)}. One worker of one thread pinned to core {CORE}, {ROWS:,} MNIST-shaped rows, "
        f"SGD with momentum; each run's epoch is the mean of its epochs after the first (at least "
        f"{MEASURED_SECONDS:.0f} s of them), as `benchmarks.plan` measures a job; {args.runs} runs of each job, "
        f"interleaved. `.venv/bin/python -m benchmarks.repeatability --runs {args.runs}` ({seconds:.0f} s).", "",
        f"**{within} of {total} runs within {GOAL:.0%} of their job's median run.**", "",
        "| model | batch | median s/epoch | runs (s/epoch) | largest deviation from the median | slowest / fastest "
        "run | slowest / fastest epoch of one run |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        runs = ", ".join(f"{run:.3f}" for run in row["runs"])
        lines.append(f"| {row['model']} | {row['batch']} | {row['median']:.3f} | {runs} | "
                     f"{row['largest_deviation']:+.1%} | {row['spread']:.2f} | {row['spread_within_run']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="runs of each job (default 7)")
    args = parser.parse_args(argv)
    if len(os.sched_getaffinity(0)) <= CORE or shutil.which("taskset") is None:
        sys.exit(f"benchmarks.repeatability: needs taskset and a core numbered {CORE}")
    began = time.monotonic()
    folder = WORK / "repeatability"
    folder.mkdir(parents=True, exist_ok=True)
    jobs = job_files(folder)
    found = {key: [] for key in jobs}
    for run in range(args.runs):
        for key, job in jobs.items():
            found[key].append(one_run(job, folder / "run"))
            print(f"run {run + 1}: {key[0]} batch {key[1]}: {statistics.mean(found[key][-1]):.3f} s/epoch",
                  flush=True)
    rows = [summary(model, batch, runs) for (model, batch), runs in found.items()]
    info = machine()
    path = write_result("repeatability", report(rows, args, time.monotonic() - began, info),
                        {"machine": info, "results": rows})
    print(path.read_text())
    print(f"written: {path}")


if __name__ == "__main__":
    main()
