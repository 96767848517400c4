"""Start-up: how long a tiny job takes from `shoal train` to its first training step, and in all.

Every job pays this fixed cost once (processes, imports, checks, meeting, loading); it is what
makes a small dataset slower on more machines in the scaling study. With `--against REF` the
same job runs from the source of a git revision too, interleaved with this tree's runs so that
the machine's drift falls on both alike, and the report gives the ratio. With `--restart` a worker
kills itself (SIGKILL) in the second epoch and the job restarts from the first epoch's checkpoint:
the report gives, too, the seconds from that failure to the restarted workers' resumption.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

from benchmarks.common import ROOT, WORK, machine, machine_line, median, write_result
from shoal.data.synthetic import synth_binary
from shoal.events import JobResumed, read_history

JOB = """[model]
{model}
[data]
train = "{train}"
[train]
epochs = {epochs}
batch_size = 64
optimizer = {{ name = "adam", lr = 0.003 }}
[output]
progress = "none"
[checkpoint]
every = {every}
"""
LAYERS = 'layers = [{ dense = 16, activation = "relu" }, { dense = 2 }]'
# the same 32-16-2 model, whose rank 1 SIGKILLs itself on its `at`-th step (once: the marker file says it did)
SABOTAGED = ('factory = "tests.support.models:sabotaged"\n'
             'arguments = {{ features = 32, action = "kill", at = {at}, marker = "{marker}" }}')


def job_text(train: Path, rows: int, workers: int, marker: Path | None) -> str:
    """The tiny job; with `marker`, two epochs, a checkpoint after each, and a worker killed in the second."""
    if marker is None:
        return JOB.format(model=LAYERS, train=train, epochs=1, every=0)
    steps = rows // workers // 64
    return JOB.format(model=SABOTAGED.format(at=steps + steps // 2, marker=marker), train=train, epochs=2, every=1)


def source_of(revision: str, folder: Path) -> Path:
    """The `src` folder of `revision`, unpacked from git into `folder` (nothing in the repository changes)."""
    archive = subprocess.run(["git", "archive", "--format=tar", revision, "src"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder / "src"


def one_job(source: Path, job: Path, run_dir: Path, workers: int, marker: Path | None) -> tuple[float, ...]:
    """Seconds to the first training step (the first epoch's start) and in all, from the command's start; with
    `marker` (a restart), the seconds from the worker's failure to the job's resumption too."""
    shutil.rmtree(run_dir, ignore_errors=True)
    if marker is not None:
        marker.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(source), str(ROOT))))  # ROOT: the sabotaged model
    began = time.time()
    subprocess.run([sys.executable, "-m", "shoal", "train", str(job), "--workers", str(workers), "--run-dir",
                    str(run_dir), "--max-restarts", "1"], check=True, cwd=ROOT, env=env, capture_output=True)
    total = time.time() - began
    history = read_history(run_dir)
    first = history.epochs[0]
    timings = (first.time - first.seconds - began, total)
    if marker is None:
        return timings
    # the model touches the marker just before its SIGKILL; the worker_failed event comes later, once the
    # launcher has seen the failure and stopped the other workers, which is part of what a restart costs
    return (*timings, history.last(JobResumed).time - marker.stat().st_mtime)


WORKLOADS = {False: "one epoch, no checkpoint",
             True: "two epochs, a checkpoint after each, rank 1 killed (SIGKILL) halfway through the second"}


def median_and_runs(runs: list[tuple[float, ...]], index: int) -> str:
    """Two table cells: the median of each run's `index`-th timing, and every run's."""
    return f"{median([run[index] for run in runs]):.2f} | {', '.join(f'{run[index]:.2f}' for run in runs)}"


def report(results: dict, args, info: dict) -> str:
    lines = [
        "# start-up: a tiny job's fixed cost", "",
        f"Machine: {machine_line(info)}.",
        f"Workload: {args.rows:,} rows x 32 features, 32-16-2, {WORKLOADS[args.restart]}, {args.workers} "
        f"worker(s) on one machine; {args.runs} interleaved runs of each tree. Command: `python -m "
        f"benchmarks.startup{' --against ' + args.against if args.against else ''}"
        f"{' --restart' if args.restart else ''}`.", "",
        "| tree | median to the first step (s) | median in all (s) | runs in all (s) |"
        + (" median from the failure to the resumption (s) | runs (s) |" if args.restart else ""),
        "| --- | --- | --- | --- |" + (" --- | --- |" if args.restart else ""),
    ]
    for name, runs in results.items():
        lines.append(f"| {name} | {median([r[0] for r in runs]):.2f} | {median_and_runs(runs, 1)} |"
                     + (f" {median_and_runs(runs, 2)} |" if args.restart else ""))
    if len(results) == 2:
        (new, new_runs), (old, old_runs) = results.items()
        ratio = median([r[1] for r in new_runs]) / median([r[1] for r in old_runs])
        lines += ["", f"**Ratio {new} / {old}, in all: {ratio:.3f}**"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", help="a git revision to compare with (e.g. HEAD)")
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--restart", action="store_true", help="a worker is killed in the second epoch")
    args = parser.parse_args(argv)
    folder = WORK / "startup"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    synth_binary(str(folder / "train"), args.rows)
    job = folder / "job.toml"
    marker = folder / "killed" if args.restart else None
    job.write_text(job_text(folder / "train", args.rows, args.workers, marker))
    trees = {"this tree": ROOT / "src"}
    with tempfile.TemporaryDirectory(prefix="shoal-startup-") as unpacked:
        if args.against:
            commit = subprocess.run(["git", "rev-parse", "--short", args.against], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout.strip()
            trees[commit] = source_of(commit, Path(unpacked))
        results = {name: [] for name in trees}
        for _ in range(args.runs):
            for name, source in trees.items():
                results[name].append(one_job(source, job, folder / "run", args.workers, marker))
    text = report(results, args, machine())
    print(text)
    write_result("startup", text, {"arguments": vars(args), "runs": results})


if __name__ == "__main__":
    main()
