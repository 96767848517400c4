"""Start-up: how long a tiny job takes from `shoal train` to its first training step, and in all.

Every job pays this fixed cost once (processes, imports, checks, meeting, loading); it is what
makes a small dataset slower on more machines in the scaling study. With `--against REF` the
same job runs from the source of a git revision too, interleaved with this tree's runs so that
the machine's drift falls on both alike, and the report gives the ratio.
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
from shoal.events import read_history

JOB = """[model]
layers = [{{ dense = 16, activation = "relu" }}, {{ dense = 2 }}]
[data]
train = "{train}"
[train]
epochs = 1
batch_size = 64
optimizer = {{ name = "adam", lr = 0.003 }}
[output]
progress = "none"
[checkpoint]
every = 0
"""


def source_of(revision: str, folder: Path) -> Path:
    """The `src` folder of `revision`, unpacked from git into `folder` (nothing in the repository changes)."""
    archive = subprocess.run(["git", "archive", "--format=tar", revision, "src"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder / "src"


def one_job(source: Path, job: Path, run_dir: Path, workers: int) -> tuple[float, float]:
    """Seconds to the first training step (the first epoch's start) and in all, from the command's start."""
    shutil.rmtree(run_dir, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(source))
    began = time.time()
    subprocess.run([sys.executable, "-m", "shoal", "train", str(job), "--workers", str(workers), "--run-dir",
                    str(run_dir)], check=True, cwd=ROOT, env=env, capture_output=True)
    total = time.time() - began
    first = read_history(run_dir).epochs[0]
    return first.time - first.seconds - began, total


def report(results: dict, args, info: dict) -> str:
    lines = [
        "# start-up: a tiny job's fixed cost", "",
        f"Machine: {machine_line(info)}.",
        f"Workload: {args.rows:,} rows x 32 features, 32-16-2, one epoch, no checkpoint, {args.workers} worker(s) "
        f"on one machine; {args.runs} interleaved runs of each tree. Command: `python -m benchmarks.startup"
        f"{' --against ' + args.against if args.against else ''}`.", "",
        "| tree | median to the first step (s) | median in all (s) | runs in all (s) |",
        "| --- | --- | --- | --- |",
    ]
    for name, runs in results.items():
        lines.append(f"| {name} | {median([r[0] for r in runs]):.2f} | {median([r[1] for r in runs]):.2f} | "
                     f"{', '.join(f'{r[1]:.2f}' for r in runs)} |")
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
    args = parser.parse_args(argv)
    folder = WORK / "startup"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    synth_binary(str(folder / "train"), args.rows)
    job = folder / "job.toml"
    job.write_text(JOB.format(train=folder / "train"))
    trees = {"this tree": ROOT / "src"}
    with tempfile.TemporaryDirectory(prefix="shoal-startup-") as unpacked:
        if args.against:
            commit = subprocess.run(["git", "rev-parse", "--short", args.against], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout.strip()
            trees[commit] = source_of(commit, Path(unpacked))
        results = {name: [] for name in trees}
        for _ in range(args.runs):
            for name, source in trees.items():
                results[name].append(one_job(source, job, folder / "run", args.workers))
    text = report(results, args, machine())
    print(text)
    write_result("startup", text, {"arguments": vars(args), "runs": results})


if __name__ == "__main__":
    main()
