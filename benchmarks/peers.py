"""shoal side by side with its peers on the same data and cores: seconds per epoch and test accuracy.

The peers are scripts beside this one, not dependencies of shoal: a hand-written PyTorch DDP
trainer (benchmarks/peer_ddp.py), Spark MLlib's MultilayerPerceptronClassifier in pyspark's local
mode (benchmarks/peer_spark.py, the stand-in for the MapReduce approach cNeural compared against)
and scikit-learn's MLPClassifier (benchmarks/peer_sklearn.py). Two tasks, the models of
benchmarks/algorithms.py: a9a (123-100 relu-dropout 0.5-2, Adam lr 0.001, batch 32) and synthetic
digits (784-40 sigmoid-10, batch 128, Adam lr 0.001 here for every system). Each system runs
with 1 and 2 workers of one thread each (scikit-learn: one process), on float32 arrays read once
from shoal's datasets and scaled as shoal's loader scales them, and is judged on the same test
set. Every run is its own process, so setup (process start, imports, Spark's session, data
conversion) is measured from its launch to the start of training and reported apart from the
seconds per epoch: the median of the epochs after the first where per-epoch times exist, else
fit seconds / epochs (iterations) run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

from benchmarks.algorithms import SHARED_A9A, prepare_a9a, prepare_digits, summarize, write_job
from benchmarks.common import ROOT, WORK, machine, machine_line, median, shoal_train, write_result
from shoal.data.format import open_dataset
from shoal.data.loader import feature_scale

FOLDER = WORK / "peers"
TEST_ROWS = 20_000  # digits test rows (seed 2)

# The models of benchmarks/algorithms.py MODELS, spelled out for the peers; digits trains with Adam here.
TASKS = {
    "a9a": {"hidden": 100, "activation": "relu", "dropout": 0.5, "batch_size": 32, "lr": 0.001},
    "digits": {"hidden": 40, "activation": "sigmoid", "dropout": 0.0, "batch_size": 128, "lr": 0.001},
}
SYSTEMS = [  # (system, label, worker counts)
    ("shoal-sync", "shoal, sync", (1, 2)),
    ("shoal-averaging", "shoal, averaging (period epoch)", (1, 2)),
    ("ddp", "PyTorch DDP, hand-written", (1, 2)),
    ("spark", "Spark MLlib MLP, local[N]", (1, 2)),
    ("sklearn", "scikit-learn MLPClassifier", (1,)),
]


def export_arrays(task: str, train: Path, test: Path) -> Path:
    """The peers' input: shoal's datasets as float32 features (scaled as shoal's loader does) and class indices."""
    folder = FOLDER / "arrays" / f"{task}-{train.name}-{test.name}"
    if (folder / "meta.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    classes = features = None
    for split, path in (("train", train), ("test", test)):
        dataset = open_dataset(str(path))
        values, labels = dataset.read_all()
        values = values.reshape(len(values), dataset.features).astype(np.float32)
        scale = feature_scale(dataset.feature_dtype)
        if scale != 1.0:
            values *= np.float32(scale)
        np.save(folder / f"{split}_features.npy", values)
        np.save(folder / f"{split}_labels.npy", labels.astype(np.int64))
        classes, features = dataset.num_classes, dataset.features
    (folder / "meta.json").write_text(json.dumps({"classes": classes, "features": features, "scale": scale}))
    return folder


def majority_accuracy(arrays: Path) -> float:
    """The test accuracy of always answering the most common class: the floor any model should beat."""
    labels = np.load(arrays / "test_labels.npy")
    return float(np.bincount(labels).max() / len(labels))


def run_shoal(task: str, algorithm: str, workers: int, train: Path, test: Path, epochs: int) -> dict:
    """`shoal train` with one thread per worker; setup ends where the first epoch's training began."""
    options = {"period": "epoch"} if algorithm == "averaging" else {}
    job = write_job(FOLDER / f"{task}-{algorithm}.toml", task, train, test, algorithm, options, epochs)
    run_dir = FOLDER / f"run-{task}-{algorithm}-{workers}-{time.time_ns()}"
    launched = time.time()
    try:
        history = shoal_train(job, run_dir, "--workers", str(workers), "--set", "cluster.threads=1",
                              "--set", f'train.optimizer={{ name = "adam", lr = {TASKS[task]["lr"]}, eps = 1e-8 }}')
    except subprocess.CalledProcessError as error:
        return {"failed": f"exit status {error.returncode}", "wall_seconds": time.time() - launched}
    first = history.epochs[0]
    training_started = first.time - first.seconds - first.seconds_split.evaluation
    summary = summarize(history)
    return {"accuracy": summary["accuracy"], "seconds_per_epoch": summary["seconds_per_epoch"],
            "epoch_seconds": [e.seconds for e in history.epochs],
            "epochs_run": len(history.epochs), "threads": summary["threads"],
            "setup_seconds": training_started - launched, "wall_seconds": time.time() - launched}


def run_peer(module: str, name: str, arguments: list[str]) -> dict:
    """One peer script in its own process; its output goes to a log, its result comes back as JSON."""
    out, log = FOLDER / f"{name}.json", FOLDER / f"{name}.log"
    out.unlink(missing_ok=True)
    launched = time.time()
    with open(log, "w") as handle:
        finished = subprocess.run([sys.executable, "-m", module, *arguments, "--out", str(out)], cwd=ROOT,
                                  stdout=handle, stderr=subprocess.STDOUT)
    wall = time.time() - launched
    if finished.returncode != 0 or not out.exists():
        tail = log.read_text().strip().splitlines()[-5:]
        print(f"{module} failed (exit status {finished.returncode}), last lines of {log}:", *tail, sep="\n  ")
        return {"failed": f"exit status {finished.returncode}; see {log.relative_to(ROOT)}", "wall_seconds": wall}
    result = json.loads(out.read_text())
    result["setup_seconds"] = result["training_started"] - launched
    result["wall_seconds"] = wall
    if "epoch_seconds" in result:
        seconds = result["epoch_seconds"]
        result["seconds_per_epoch"] = median(seconds[1:] or seconds)
    return result


def run_system(system: str, workers: int, task: str, paths: tuple[Path, Path], arrays: Path, epochs: int) -> dict:
    model = TASKS[task]
    name = f"{task}-{system}-{workers}"
    common = ["--data", str(arrays), "--epochs", str(epochs), "--hidden", str(model["hidden"])]
    if system.startswith("shoal-"):
        return run_shoal(task, system.removeprefix("shoal-"), workers, *paths, epochs)
    if system == "ddp":
        return run_peer("benchmarks.peer_ddp", name, [
            *common, "--workers", str(workers), "--threads", "1", "--activation", model["activation"],
            "--dropout", str(model["dropout"]), "--batch-size", str(model["batch_size"]), "--lr", str(model["lr"])])
    if system == "spark":
        return run_peer("benchmarks.peer_spark", name, [*common, "--workers", str(workers), "--solver", "l-bfgs"])
    return run_peer("benchmarks.peer_sklearn", name, [
        *common, "--threads", "1", "--activation", model["activation"], "--batch-size", str(model["batch_size"]),
        "--lr", str(model["lr"])])


def cpu_times() -> tuple[float, float]:
    """(seconds stolen by the hypervisor, all CPU seconds) so far: a virtual machine's neighbours show up here."""
    times = psutil.cpu_times()
    return times.steal, sum(times) - times.guest - times.guest_nice  # guest time is already counted in user


def stolen_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


def number(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def setup_cell(row: dict) -> str:
    split = row.get("setup_split", {})
    parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in split.items())
    return f"{row['setup_seconds']:.1f}" + (f" (of which {parts})" if parts else "")


def task_table(task: str, rows: list[dict]) -> str:
    mine = [r for r in rows if r["task"] == task]

    def baseline(system: str, workers: int) -> float | None:
        found = next((r for r in mine if r["system"] == system and r["workers"] == workers and "failed" not in r),
                     None)
        return found["seconds_per_epoch"] if found else None

    lines = ["| system | workers | epochs run (Spark: iterations) | s / epoch | setup s | test accuracy | "
             "s / epoch ÷ shoal sync | ÷ shoal averaging | stolen |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in mine:
        if "failed" in r:
            lines.append(f"| {r['label']} | {r['workers']} | failed: {r['failed']} | - | - | - | - | - | - |")
            continue
        ratios = []
        for system in ("shoal-sync", "shoal-averaging"):
            reference = baseline(system, r["workers"])
            ratios.append(number(r["seconds_per_epoch"] / reference) if reference else "-")
        lines.append(f"| {r['label']} | {r['workers']} | {r['epochs_run']} | {number(r['seconds_per_epoch'])} | "
                     f"{setup_cell(r)} | {number(r['accuracy'], 4)} | {ratios[0]} | {ratios[1]} | {r['stolen']:.0%} |")
    return "\n".join(lines)


def describe_peers(rows: list[dict]) -> str:
    """What the runs themselves report about the peers' setup: Spark's BLAS, scikit-learn's threads."""
    spark = next((r for r in rows if r["system"] == "spark" and "failed" not in r), None)
    sklearn = next((r for r in rows if r["system"] == "sklearn" and "failed" not in r), None)
    found = []
    if spark:
        found.append(f"MLlib's BLAS in these runs: `{spark['blas']}` (JNIBLAS would mean a native library).")
    same = [f"{r['task']} with {r['workers']} worker(s)" for r in rows if r["system"] == "ddp" and "failed" not in r
            and any(o["system"] == "shoal-sync" and o["task"] == r["task"] and o["workers"] == r["workers"]
                    and abs(o.get("accuracy", -1) - r["accuracy"]) < 1e-9 for o in rows)]
    if same:
        found.append(f"DDP's test accuracy equals shoal sync's on {', '.join(same)}: both start from PyTorch's "
                     "initial weights under seed 0 and each rank visits its share in the same order, so they "
                     "take the same steps.")
    if sklearn:
        found.append(f"scikit-learn ran with {', '.join(map(str, sklearn['blas_threads']))} BLAS thread(s) and "
                     f"{sklearn['dtype']} weights.")
    return " ".join(found)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="a9a,digits")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=200_000, help="synthetic digits training rows")
    parser.add_argument("--quick", action="store_true", help="1 epoch, 20,000 digits rows: a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.rows = 1, 20_000
    tasks = args.tasks.split(",")
    for task in tasks:
        if task not in TASKS:
            parser.error(f"--tasks: unknown task {task!r}; choose from {', '.join(TASKS)}")

    info = machine()
    FOLDER.mkdir(parents=True, exist_ok=True)
    paths, descriptions, skipped = {}, {}, []
    if "a9a" in tasks:
        found = prepare_a9a()
        if found is None:
            skipped.append(f"a9a skipped: {SHARED_A9A} is absent.")
        else:
            paths["a9a"] = found
            descriptions["a9a"] = (
                f"UCI Adult (a9a), {open_dataset(str(found[0])).rows:,} training and "
                f"{open_dataset(str(found[1])).rows:,} test rows, 123 features. shoal and DDP: 123-100(relu)-dropout "
                "0.5-2; scikit-learn: 123-100(relu)-2, no dropout; Spark: 123-100(sigmoid)-2, no dropout. "
                "Adam lr 0.001, batch 32 per worker (Spark: full batch).")
    if "digits" in tasks:
        paths["digits"] = prepare_digits(args.rows, TEST_ROWS)
        descriptions["digits"] = (
            f"Synthetic digits (`shoal data synth digits`), {args.rows:,} training rows (seed 1) and {TEST_ROWS:,} "
            "test rows (seed 2, the same task seed), 784 uint8 features scaled to [0, 1]. 784-40(sigmoid)-10 for "
            "every system; Adam lr 0.001 (not algorithms.py's SGD), batch 128 per worker (Spark: full batch).")

    load_before = os.getloadavg()[0]  # other work on the machine would show up in every time below
    times_before = cpu_times()
    began = time.perf_counter()
    rows = []
    for task, (train, test) in paths.items():
        arrays = export_arrays(task, train, test)
        descriptions[task] += f" Always answering the most common class scores {majority_accuracy(arrays):.4f}."
        for system, label, counts in SYSTEMS:
            for workers in counts:
                before = cpu_times()
                result = run_system(system, workers, task, (train, test), arrays, args.epochs)
                result["stolen"] = stolen_share(before, cpu_times())
                shown_label = label.replace("[N]", f"[{workers}]")
                rows.append({"task": task, "system": system, "label": shown_label, "workers": workers, **result})
                shown = result.get("failed") or (
                    f"{result['seconds_per_epoch']:.2f} s/epoch, setup {result['setup_seconds']:.1f} s, "
                    f"accuracy {result['accuracy']:.4f}")
                print(f"{task:7s} {shown_label:32s} {workers}: {shown} [{result['wall_seconds']:.0f} s]", flush=True)
    total = time.perf_counter() - began
    load = {"before": load_before, "after": os.getloadavg()[0], "stolen": stolen_share(times_before, cpu_times())}

    command = " ".join(["python -m benchmarks.peers", *(sys.argv[1:] if argv is None else argv)])
    notes = "".join(f"\n{line}\n" for line in skipped)
    sections = "\n".join(f"## {task}\n\n{descriptions[task]}\n\n{task_table(task, rows)}\n" for task in paths)
    markdown = f"""# peers: shoal beside hand-written DDP, Spark MLlib and scikit-learn

Machine: {machine_line(info)}.
Command: `{command}` ({total / 60:.1f} minutes in all; load average over one minute
{load["before"]:.2f} before the runs, {load["after"]:.2f} after them; {load["stolen"]:.0%} of the CPU time stolen by
the hypervisor during the runs).

Every system trains {args.epochs} epoch(s) with 1 and 2 workers (scikit-learn: 1 process) of one
compute thread each, so "workers" is also the cores used: shoal with `cluster.threads = 1`, DDP
with `torch.set_num_threads(1)` per process, Spark `local[N]` (N task threads; MLlib's BLAS is
single-threaded), scikit-learn with BLAS capped at one thread by threadpoolctl. All read the same
float32 arrays (digits' uint8 pixels divided by 255, as shoal's loader does) and are judged on the
same test set after the last epoch. s / epoch: training only, evaluation excluded; the median of the
epochs after the first for shoal and DDP, fit seconds / epochs (iterations) run for Spark and
scikit-learn, whose fits report no per-epoch times. Setup s: from launching the run's process to the
start of training (interpreter, imports, worker processes, loading the data; Spark also its session
and converting the train and test arrays to cached DataFrames of vectors). The ratio columns divide a row's
s / epoch by shoal's with the same number of workers (below 1: faster than shoal). Stolen: the share
of CPU time the hypervisor gave to other machines during that run; processes that wait for each other
every step (sync, DDP with 2 workers) lose most when it is high.
{notes}
{sections}
## What differs between the systems

- **shoal**: `shoal train` with the job of benchmarks/algorithms.py, `--set cluster.threads=1` and
  Adam for digits. sync all-reduces gradients every step (N workers with batch b take the steps of
  one worker with batch N x b); averaging trains each worker alone on its share and averages the
  parameters at the end of every epoch (the Parallel SGD paper's way). With 1 worker both are plain
  training.
- **PyTorch DDP** (benchmarks/peer_ddp.py): what a user writes by hand: `torch.multiprocessing`,
  gloo on 127.0.0.1, `DistributedDataParallel` (gradients all-reduced every step, like shoal's
  sync), each rank on its contiguous 1/N share with its own shuffling, batches sliced from
  in-memory tensors (no DataLoader), per-epoch time between two barriers. With one process DDP
  still runs its reducer and a gloo all-reduce after every backward pass; shoal skips communication
  with one worker.
- **Spark MLlib** (benchmarks/peer_spark.py): `MultilayerPerceptronClassifier`, solver l-bfgs
  (MLlib's default), maxIter = epochs, tol = 0, blockSize 128. MLlib's perceptron has only sigmoid
  hidden layers and no dropout, so a9a's hidden layer is sigmoid here. l-bfgs makes one full pass
  over the data per iteration (a full-batch epoch; its line search may add passes), so an "epoch"
  here is one full-batch step, not {args.epochs} x (rows / batch) Adam steps: after so few
  iterations its accuracy is not comparable with the minibatch systems'. The fit time also holds
  l-bfgs' first evaluation and MLlib stacking rows into blocks on every pass.
- **scikit-learn** (benchmarks/peer_sklearn.py): `MLPClassifier`, solver adam with the same learning
  rate and batch size, alpha = 0 (no L2), max_iter = epochs, tol = 0 and a patience longer than the
  run, so it runs every epoch; no dropout. One process.
- Initial weights differ between systems (PyTorch's defaults for shoal and DDP, Glorot for
  scikit-learn, MLlib's own); all use seed 0.

{describe_peers(rows)}
"""
    if args.quick:  # a smoke test: results are not kept
        print(markdown)
        return
    path = write_result("peers", markdown, {"machine": info, "arguments": vars(args), "tasks": TASKS, "rows": rows,
                                            "seconds": total, "load_average": load})
    print(markdown)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
