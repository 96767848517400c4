"""The Parallel SGD study on this machine: training time against dataset size and cluster size.

Kennedy et al. trained one Keras model (Dense(100, relu), Dropout(0.5), Dense(2), Adam) on
Medicare Part B claims under-sampled to minority:majority ratios from 1:1 to 1:2000 (2,240 to
2.2 million rows), on 1 to 16 nodes, 20 trials each, weights averaged every epoch. This script
does the same with `shoal bench scaling` on synthetic claims (`shoal data synth claims`: 149
features, ~424 fraud rows per million; tested on claims of another seed under-sampled to 1:1),
averaging once per epoch, and copies the study's report, tables, plots and trials into
benchmarks/results/<date>-<hardware>-scaling/. A machine with fewer cores than workers runs the
larger cluster sizes on shared cores: their times measure contention, which the report says.
The defaults are sized for a 2-core machine (minutes, not the paper's days): fewer sizes, workers
and trials than the paper, as the result says.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, ROOT, WORK, hardware_tag, machine_line
from shoal.bench.study import read_trials
from shoal.data.claims import synth_claims
from shoal.data.derive import sample
from shoal.data.format import open_dataset

TEST_RATIO = "1:1"
"""The test set's minority:majority ratio: the study's balanced classes."""

JOB = """[model]
layers = [{{ dense = 100, activation = "relu" }}, {{ dropout = 0.5 }}, {{ dense = 2 }}]

[data]
train = "{train}"
test = "{test}"

[algorithm]
name = "averaging"
period = "epoch"

[train]
epochs = {epochs}
batch_size = {batch_size}
optimizer = {{ name = "adam", lr = 0.001 }}
loss = "cross_entropy"
seed = 0

[cluster]
threads = 1
"""


def shoal(*arguments: str) -> None:
    subprocess.run([sys.executable, "-m", "shoal", *arguments], check=True, cwd=ROOT)


def write_claims_job(rows: int, epochs: int, batch_size: int) -> Path:
    """The study's job on `rows` synthetic claims (made once under benchmarks/work/scaling)."""
    folder = WORK / "scaling"
    train = folder / f"claims-{rows}"
    if not train.exists():
        shoal("data", "synth", "claims", "--rows", str(rows), "--seed", "1", "--out", str(train))
    test = write_test_set(folder)
    job = folder / "job.toml"
    job.write_text(JOB.format(train=train, test=test, epochs=epochs, batch_size=batch_size))
    return job


def write_test_set(folder: Path, pool_rows: int = 2_000_000) -> Path:
    """The test set: claims drawn with another seed, under-sampled to the study's 1:1, the balance of its
    smallest training set, so accuracy is not the majority's share (made once; the folder names the ratio,
    so a test set of an older ratio is never reused)."""
    test = test_set_path(folder)
    if not test.exists():
        pool = folder / "claims-pool"
        shutil.rmtree(pool, ignore_errors=True)
        synth_claims(str(pool), pool_rows, seed=2)
        sample(str(pool), test, ratio=TEST_RATIO, seed=2)
        shutil.rmtree(pool)
    return test


def test_set_path(folder: Path) -> Path:
    return folder / f"claims-test-{TEST_RATIO.replace(':', '-')}"


def majority_share(dataset: Path) -> float:
    """The accuracy of always answering the most common class of `dataset`: the floor a classifier must beat."""
    labels = open_dataset(str(dataset)).read_all()[1]
    return float(np.bincount(labels).max() / len(labels))


def not_above_majority(trials: list[dict], share: float) -> list[str]:
    """The cells (size, workers) whose mean test accuracy is not above the majority's share."""
    cells: dict[tuple[str, int], list[float]] = {}
    for row in trials:
        if row.get("test_accuracy") is not None:
            cells.setdefault((row["size"], row["workers"]), []).append(row["test_accuracy"])
    return [f"{size} with {workers} worker(s): {np.mean(values):.4f}" for (size, workers), values in cells.items()
            if np.mean(values) <= share + 1e-9]  # float noise: the share exactly is no better


def accuracy_note(test: Path, out: Path) -> str:
    """The majority's share of the test set beside the report's accuracies, and a warning naming each cell that
    does not beat it (printed too): such an accuracy says nothing about what the model learned."""
    share = majority_share(test)
    note = (f"The test set holds claims rows at {TEST_RATIO} drawn with another seed: always answering the majority "
            f"class scores {share:.4f}, the floor the accuracy column must beat; the AUC column shows what the "
            "models learned.")
    failing = not_above_majority(read_trials(out), share)
    if failing:
        warning = f"accuracy not above the majority's share {share:.4f} in " + "; ".join(failing)
        print(f"benchmarks.scaling: WARNING: {warning}", file=sys.stderr)
        note += f" **Warning**: {warning}."
    return note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="synthetic claims rows to draw the sizes from")
    parser.add_argument("--ratios", default="1:1,1:10,1:100,1:1000,1:2000")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--out", type=Path, default=WORK / "scaling" / "study")
    args = parser.parse_args(argv)

    job = write_claims_job(args.rows, args.epochs, args.batch_size)
    began = time.perf_counter()
    shoal("bench", "scaling", str(job), "--ratios", args.ratios, "--workers", args.workers,
          "--trials", str(args.trials), "--out", str(args.out))
    minutes = (time.perf_counter() - began) / 60

    results = RESULTS / f"{date.today().isoformat()}-{hardware_tag()}-scaling"
    results.mkdir(parents=True, exist_ok=True)
    for name in ("report.md", "trials.csv", "anova.csv", "tukey.csv", "study.json", *(p.name for p in
                 args.out.glob("*.png"))):
        shutil.copy2(args.out / name, results / name)
    note = (f"\n## How this result was made\n\n`python -m benchmarks.scaling` ({minutes:.0f} minutes for the trials "
            f"this run added) on {machine_line()}: {args.rows:,} synthetic claims rows, ratios {args.ratios}, "
            f"workers {args.workers} (1 thread each), {args.trials} trials per cell (the paper: 20), "
            f"{args.epochs} epochs at batch {args.batch_size} per worker, weights averaged every epoch. "
            f"{accuracy_note(test_set_path(job.parent), args.out)} "
            "The study measures time; 2 epochs is too few to train the rare class well.\n")
    with open(results / "report.md", "a", encoding="utf-8") as handle:
        handle.write(note)
    print(f"results: {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
