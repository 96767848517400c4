"""Start-up: how long a tiny job takes from `shoal train` to its first training step, and in all.

Every job pays this fixed cost once (processes, imports, checks, meeting, loading); it is what
makes a small dataset slower on more machines in the scaling study. With `--against REF` the
same job runs from the source of a git revision too, interleaved with this tree's runs so that
the machine's drift falls on both alike, and the report gives the ratio. With `--restart` a worker
kills itself (SIGKILL) in the second epoch and the job restarts from the first epoch's checkpoint:
the report gives, too, the seconds from that failure to the restarted workers' resumption. With
`--torch-forkserver` the same job runs a third way, interleaved too: torch's agent starts each worker as a
function in a process forked by multiprocessing's forkserver, which preloads `shoal.worker`
(`multiprocessing.set_forkserver_preload`) and starts first thing, where shoal's own fork server would.
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
from shoal.cluster.node.launch import TORCH_FORKSERVER
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


SHOAL = ("-m", "shoal")
# `shoal train` with multiprocessing's forkserver in place of shoal's own: started as early, preloading the worker
TORCH_SERVER = ("-c", """import contextlib, multiprocessing, multiprocessing.forkserver
multiprocessing.set_forkserver_preload(["shoal.worker"])
multiprocessing.forkserver.ensure_running()
from shoal.cluster.node import forkserver
forkserver.serving = lambda module=None, wanted=True: contextlib.nullcontext()
from shoal.cli import run
run()
""")


def source_of(revision: str, folder: Path) -> Path:
    """The `src` folder of `revision`, unpacked from git into `folder` (nothing in the repository changes)."""
    archive = subprocess.run(["git", "archive", "--format=tar", revision, "src"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder / "src"


def one_job(tree: tuple[Path, tuple[str, ...]], job: Path, run_dir: Path, workers: int,
            marker: Path | None) -> tuple[float, ...]:
    """Seconds to the first training step (the first epoch's start) and in all, from the command's start; with
    `marker` (a restart), the seconds from the worker's failure to the job's resumption too. `tree`: the source
    and how the command starts (SHOAL or TORCH_SERVER)."""
    source, command = tree
    shutil.rmtree(run_dir, ignore_errors=True)
    if marker is not None:
        marker.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(source), str(ROOT))))  # ROOT: the sabotaged model
    env.pop(TORCH_FORKSERVER, None)
    if command == TORCH_SERVER:
        env[TORCH_FORKSERVER] = "1"
    began = time.time()
    subprocess.run([sys.executable, *command, "train", str(job), "--workers", str(workers), "--run-dir",
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
        f"{' --restart' if args.restart else ''}{' --torch-forkserver' if args.torch_forkserver else ''}`.", "",
        "| tree | median to the first step (s) | median in all (s) | runs in all (s) |"
        + (" median from the failure to the resumption (s) | runs (s) |" if args.restart else ""),
        "| --- | --- | --- | --- |" + (" --- | --- |" if args.restart else ""),
    ]
    for name, runs in results.items():
        lines.append(f"| {name} | {median([r[0] for r in runs]):.2f} | {median_and_runs(runs, 1)} |"
                     + (f" {median_and_runs(runs, 2)} |" if args.restart else ""))
    (first, first_runs), *others = results.items()
    for other, runs in others:  # each against this tree's (shoal's fork server)
        ratios = [median([r[index] for r in runs]) / median([r[index] for r in first_runs])
                  for index in range(len(runs[0]))]
        lines += ["", f"**Ratio {other} / {first}, in all: {ratios[1]:.3f}** (to the first step: {ratios[0]:.3f}"
                  + (f"; from the failure to the resumption: {ratios[2]:.3f})" if args.restart else ")")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", help="a git revision to compare with (e.g. HEAD)")
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--restart", action="store_true", help="a worker is killed in the second epoch")
    parser.add_argument("--torch-forkserver", action="store_true",
                        help="also start the workers from multiprocessing's forkserver, preloading shoal.worker")
    args = parser.parse_args(argv)
    folder = WORK / "startup"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    synth_binary(str(folder / "train"), args.rows)
    job = folder / "job.toml"
    marker = folder / "killed" if args.restart else None
    job.write_text(job_text(folder / "train", args.rows, args.workers, marker))
    trees = {"this tree": (ROOT / "src", SHOAL)}
    if args.torch_forkserver:
        trees["this tree, torch's forkserver"] = (ROOT / "src", TORCH_SERVER)
    with tempfile.TemporaryDirectory(prefix="shoal-startup-") as unpacked:
        if args.against:
            commit = subprocess.run(["git", "rev-parse", "--short", args.against], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout.strip()
            trees[commit] = (source_of(commit, Path(unpacked)), SHOAL)
        results = {name: [] for name in trees}
        for _ in range(args.runs):
            for name, tree in trees.items():
                results[name].append(one_job(tree, job, folder / "run", args.workers, marker))
    text = report(results, args, machine())
    print(text)
    write_result("startup", text, {"arguments": vars(args), "runs": results})


if __name__ == "__main__":
    main()
