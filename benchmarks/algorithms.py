"""Test accuracy against training workers for sync, averaging, Downpour and EASGD (mpi_learn's Fig. 2).

Each algorithm trains for E epochs (default 10) with 1, 2, 4 and 8 training workers on two
tasks: UCI Adult (a9a, the Parallel SGD paper's 123-100-2 model with dropout, Adam lr 0.001,
batch 32), imported from ../shared/data/a9a when that folder exists, and synthetic MNIST-shaped
digits (cNeural's 784-40-10 sigmoid perceptron, SGD lr 0.1 momentum 0.5, batch 128; cNeural's lr 0.5 momentum 0.9
diverges under Downpour's stale updates). "Workers"
counts the processes that train: Downpour and asynchronous EASGD run one more process, the
parameter server on rank 0. Each run records the final test accuracy, seconds per epoch
(median over epochs after the first) and, for the server algorithms, the mean staleness of the
updates the server applied. A PNG per task plots accuracy against workers, one line per
algorithm. On a machine with fewer cores than processes the times measure contention.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    ROOT,
    WORK,
    epoch_seconds,
    hardware_tag,
    machine,
    machine_line,
    median,
    shoal_train,
    write_result,
)
from shoal.data.format import open_dataset
from shoal.events import History

SHARED_A9A = ROOT.parent / "shared" / "data" / "a9a"

# name -> (options written under [algorithm], whether rank 0 is a server that does not train)
ALGORITHMS = {
    "sync": ({}, False),
    "averaging": ({"period": "epoch"}, False),
    "downpour": ({"sync_every": 1, "synchronous": False}, True),
    "easgd": ({"elastic_force": 0.1, "period": 4, "momentum": 0.0, "synchronous": False}, True),
}

MODELS = {
    "a9a": ('input = [123]\nlayers = [{ dense = 100, activation = "relu" }, { dropout = 0.5 }, { dense = 2 }]',
            '{ name = "adam", lr = 0.001, eps = 1e-8 }', 32),
    "digits": ('input = [784]\nlayers = [{ dense = 40, activation = "sigmoid" }, { dense = 10 }]',
               '{ name = "sgd", lr = 0.1, momentum = 0.5 }', 128),
}


def shoal_data(*arguments: str) -> None:
    subprocess.run([sys.executable, "-m", "shoal", "data", *arguments], check=True, cwd=ROOT)


def prepare_a9a() -> tuple[Path, Path] | None:
    """The a9a train and test datasets in benchmarks/work, imported once; None when the source is absent."""
    if not SHARED_A9A.is_dir():
        return None
    folder = WORK / "a9a"
    paths = (folder / "train", folder / "test")
    for source, out in zip(("a9a", "a9a.t"), paths):
        if not out.exists():
            shoal_data("import", str(SHARED_A9A / source), str(out), "--format", "libsvm", "--n-features", "123")
    return paths


def prepare_digits(train_rows: int, test_rows: int = 10_000) -> tuple[Path, Path]:
    """Synthetic digits: `train_rows` rows drawn with seed 1, `test_rows` with seed 2 (one task)."""
    folder = WORK / "digits"
    train, test = folder / f"train-{train_rows}", folder / f"test-{test_rows}"
    for out, rows, seed in ((train, train_rows, 1), (test, test_rows, 2)):
        if not out.exists():
            shoal_data("synth", "digits", "--rows", str(rows), "--seed", str(seed), "--out", str(out))
    return train, test


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def write_job(path: Path, dataset: str, train: Path, test: Path, algorithm: str, options: dict, epochs: int,
              batch_size: int | None = None) -> Path:
    """A job file for `dataset`'s model trained with `algorithm`."""
    model, optimizer, default_batch = MODELS[dataset]
    algorithm_lines = "\n".join(f"{key} = {toml_value(value)}" for key, value in options.items())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""[model]
{model}

[data]
train = "{train}"
test = "{test}"

[algorithm]
name = "{algorithm}"
{algorithm_lines}

[train]
epochs = {epochs}
batch_size = {batch_size or default_batch}
optimizer = {optimizer}
loss = "cross_entropy"
seed = 0
""")
    return path


def summarize(history: History) -> dict:
    """What one run says: accuracy, time per epoch, rates, and the server's staleness."""
    start, ends = history.start, history.epochs
    final = ends[-1]
    summary = {
        "accuracy": final.test.get("accuracy"),
        "test_loss": final.test.get("loss"),
        "accuracy_per_epoch": [e.test.get("accuracy") for e in ends],
        "seconds_per_epoch": median(epoch_seconds(history)),
        "samples_per_second": median([e.samples_per_second for e in ends[1:] or ends]),
        "communication": median([e.seconds_split.communication for e in ends[1:] or ends]),
        "threads": start.threads,
        "trainers": start.trainers,
        "train_loss": final.train_loss,
    }
    reports = [e.algorithm for e in ends if (e.algorithm or {}).get("updates")]
    if reports:
        updates = sum(r["updates"] for r in reports)
        summary["updates"] = updates
        summary["staleness_mean"] = sum(r["staleness"]["mean"] * r["updates"] for r in reports) / updates
        summary["staleness_max"] = max(r["staleness"]["max"] for r in reports)
    return summary


def train_once(job: Path, run_dir: Path, processes: int) -> dict:
    """One `shoal train` with `processes` local processes; a failed run is recorded, not fatal."""
    began = time.perf_counter()
    try:
        history = shoal_train(job, run_dir, "--workers", str(processes))
    except subprocess.CalledProcessError as error:
        return {"failed": f"exit status {error.returncode}", "wall_seconds": time.perf_counter() - began}
    return {**summarize(history), "wall_seconds": time.perf_counter() - began}


def plot(path: Path, dataset: str, rows: list[dict], algorithms: list[str], workers: list[int], epochs: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6, 4))
    for algorithm in algorithms:
        points = [(r["workers"], r["accuracy"]) for r in rows
                  if r["dataset"] == dataset and r["algorithm"] == algorithm and r.get("accuracy") is not None]
        if points:
            axes.plot(*zip(*points), marker="o", label=algorithm)
    axes.set_xscale("log", base=2)
    axes.set_xticks(workers, [str(w) for w in workers])
    axes.set_xlabel("training workers (Downpour and EASGD: + 1 server process)")
    axes.set_ylabel(f"test accuracy after {epochs} epochs")
    axes.set_title(f"{dataset}: accuracy against workers")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


DETAIL_HEADER = ("| algorithm | training workers | processes | threads each | accuracy | s / epoch | samples / s "
                 "| communication (s / epoch, mean per worker) | mean staleness |\n"
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def number(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def dataset_section(dataset: str, rows: list[dict], algorithms: list[str], workers: list[int], image: str,
                    description: str) -> str:
    mine = [r for r in rows if r["dataset"] == dataset]

    def cell(algorithm, count):
        found = next((r for r in mine if r["algorithm"] == algorithm and r["workers"] == count), None)
        if found is None:
            return "-"
        return "failed" if "failed" in found else number(found["accuracy"])

    header = " | ".join(str(w) for w in workers)
    matrix = "\n".join(f"| {a} | " + " | ".join(cell(a, w) for w in workers) + " |" for a in algorithms)
    detail = "\n".join(
        f"| {r['algorithm']} | {r['workers']} | {r['processes']} | {r.get('threads', '-')} | "
        + ("failed: " + r["failed"] + " | - | - | - | - | - |" if "failed" in r else
           f"{number(r['accuracy'])} | {number(r['seconds_per_epoch'], 2)} | {r['samples_per_second']:,.0f} | "
           f"{number(r['communication'], 2)} | {number(r.get('staleness_mean'), 2)} |")
        for r in mine)
    return f"""## {dataset}

{description}

Test accuracy after the last epoch (rows: algorithm; columns: training workers):

| algorithm | {header} |
| --- |{" --- |" * len(workers)}
{matrix}

![accuracy against workers on {dataset}]({image})

{DETAIL_HEADER}
{detail}
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", default="1,2,4,8", help="training workers, comma-separated")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--datasets", default="a9a,digits")
    parser.add_argument("--digits-rows", type=int, default=60_000, help="synthetic digits training rows")
    parser.add_argument("--digits-test-rows", type=int, default=10_000)
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    algorithms = args.algorithms.split(",")
    datasets = args.datasets.split(",")
    for name in algorithms:
        if name not in ALGORITHMS:
            parser.error(f"--algorithms: unknown algorithm {name!r}; choose from {', '.join(ALGORITHMS)}")
    for name in datasets:
        if name not in MODELS:
            parser.error(f"--datasets: unknown dataset {name!r}; choose from {', '.join(MODELS)}")

    info = machine()
    cores = info["cores"]
    paths, descriptions, skipped = {}, {}, []
    if "a9a" in datasets:
        found = prepare_a9a()
        if found is None:
            print(f"a9a skipped: {SHARED_A9A} is absent", flush=True)
            skipped.append(f"a9a skipped: {SHARED_A9A} is absent.")
        else:
            paths["a9a"] = found
            descriptions["a9a"] = (f"UCI Adult (a9a), {open_dataset(str(found[0])).rows:,} training and "
                                   f"{open_dataset(str(found[1])).rows:,} test rows; 123-100(relu)-dropout 0.5-2, "
                                   "Adam lr 0.001, batch 32 per worker.")
    if "digits" in datasets:
        paths["digits"] = prepare_digits(args.digits_rows, args.digits_test_rows)
        descriptions["digits"] = (f"Synthetic digits (`shoal data synth digits`), {args.digits_rows:,} training rows "
                                  f"(seed 1) and {args.digits_test_rows:,} test rows (seed 2); 784-40(sigmoid)-10, "
                                  "SGD lr 0.1 momentum 0.5 (cNeural's lr 0.5, momentum 0.9 diverge when stale), "
                                  "batch 128 per worker.")

    folder = WORK / "algorithms"
    rows = []
    for dataset, (train, test) in paths.items():
        for algorithm in algorithms:
            options, server = ALGORITHMS[algorithm]
            job = write_job(folder / f"{dataset}-{algorithm}.toml", dataset, train, test, algorithm, options,
                            args.epochs)
            for count in workers:
                processes = count + 1 if server else count
                run_dir = folder / f"run-{dataset}-{algorithm}-{count}-{time.time_ns()}"
                result = train_once(job, run_dir, processes)
                rows.append({"dataset": dataset, "algorithm": algorithm, "workers": count, "processes": processes,
                             **result})
                shown = result.get("failed") or (
                    f"accuracy {number(result['accuracy'])}, {result['seconds_per_epoch']:.2f} s/epoch"
                    + (f", staleness {result['staleness_mean']:.2f}" if "staleness_mean" in result else ""))
                print(f"{dataset:7s} {algorithm:10s} {count} worker(s), {processes} process(es): {shown} "
                      f"[{result['wall_seconds']:.0f} s]", flush=True)

    stem = f"{date.today().isoformat()}-{hardware_tag(info)}-algorithms"
    sections = []
    for dataset in paths:
        image = f"{stem}-{dataset}.png"
        plot(RESULTS / image, dataset, rows, algorithms, workers, args.epochs)
        sections.append(dataset_section(dataset, rows, algorithms, workers, image, descriptions[dataset]))

    crowded = sorted({r["processes"] for r in rows if r["processes"] > cores})
    warning = (f"\n**Warning:** runs with {', '.join(map(str, crowded))} processes exceed this machine's "
               f"{cores} cores: "
               "their processes share cores, so their seconds per epoch measure contention, not scaling "
               "(accuracy is still meaningful).\n" if crowded else "")
    options = "; ".join(f"{name}: " + (", ".join(f"{k} = {toml_value(v)}" for k, v in ALGORITHMS[name][0].items())
                                       or "no options") for name in algorithms)
    total = sum(r["wall_seconds"] for r in rows)
    command = " ".join(["python -m benchmarks.algorithms", *(sys.argv[1:] if argv is None else argv)])
    notes = "".join(f"\n{line}\n" for line in skipped)
    sections = "\n".join(sections)
    markdown = f"""# algorithms: test accuracy against training workers (mpi_learn's Fig. 2)

Machine: {machine_line(info)}. Cores available to the benchmark: {cores}; each process gets
cores / processes threads, at least 1 (`cluster.threads = 0`).
Command: `{command}` ({total / 60:.1f} minutes).

"Workers" are training workers. Downpour and EASGD (asynchronous) run one more process, the
parameter server on rank 0, which does not train: W workers = `--workers W+1`. sync and averaging
train on every process; with 1 worker they are plain training. Every worker uses the batch size
given below, so W workers process W batches per step (sync: one step of W x batch rows;
Downpour: W updates). Each run trains {args.epochs} epoch(s) with seed 0; accuracy is on the test
set after the last epoch; seconds per epoch are training only (evaluation excluded), the median
over epochs after the first. Mean staleness: over all updates the server applied, its version
minus the version the update was computed from.

Options: {options}.
{warning}{notes}
{sections}"""
    path = write_result("algorithms", markdown, {"machine": info, "arguments": vars(args), "rows": rows,
                                                 "options": {name: ALGORITHMS[name][0] for name in algorithms}})
    print(markdown)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
