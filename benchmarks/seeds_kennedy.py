"""Kennedy et al.'s study at their scale: training time against dataset size on 1, 2, 4, 8 and 16 machines.

The paper (Parallel SGD on a commodity cluster) trains its Keras worker on Medicare claims under-sampled to
ratios from 1:1 to 1:2000, on 1 to 16 nodes, and finds from which size more nodes pay: 2 nodes from 6,720
rows, 8 from 57,120, 16 from 1,121,120. Here `shoal bench scaling` runs examples/claims-kennedy.toml (the
paper's worker: batch 32, 20% held out, the optimizer started afresh after each epoch's average) on synthetic
claims, on the emulated cluster of 16 hosts dilated by D = 8 (tests/cluster/hosts.py: each host 1/8 of a core
and of a 1 Gbit/s link, a keeper on each core). Before the study `shoal plan` measures the profile on host0
and host1, so the report sets the plan's prediction beside every cell. The report's seconds are the dilated
cluster's (ANOVA, Tukey's groups and the plan's relative error do not change with the scale); the counterpart
file divides them by D and sets the paper's sizes beside the ones measured here.

    .venv/bin/python -m benchmarks.seeds_kennedy         # about 100 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from datetime import date
from pathlib import Path

from tests.cluster.hosts import EmulatedCluster

from benchmarks.common import RESULTS, ROOT, hardware_tag, require_cluster
from benchmarks.scaling import write_claims_job
from benchmarks.seeds import HOSTS, how_made, plan_errors, resumed, run_study, write_results
from shoal.bench.analysis import analyze
from shoal.bench.study import read_trials
from shoal.plan.profile import load_profile

EXAMPLE = ROOT / "examples" / "claims-kennedy.toml"
# the paper's sizes (rows) from which 2, 8 and 16 nodes paid (its Table 2 and Figure 4)
PAPER_PAYS = {2: 6_720, 8: 57_120, 16: 1_121_120}


def write_job(folder: Path, rows: int, epochs: int) -> Path:
    """examples/claims-kennedy.toml on `rows` synthetic claims and the study's 1:1 test set."""
    made = write_claims_job(rows, epochs, 32)  # makes the data once; its job is the older study's
    text = made.read_text()
    train = next(line for line in text.splitlines() if line.startswith("train = "))
    test = next(line for line in text.splitlines() if line.startswith("test = "))
    job = EXAMPLE.read_text().replace('train = "data/claims/train"', train).replace('test = "data/claims/test"', test)
    job = job.replace("epochs = 5", f"epochs = {epochs}")
    path = folder / "claims-kennedy.toml"
    path.write_text(job)
    return path


def counterpart(study: Path, nodes: list[int], dilation: int) -> str:
    """The paper's sizes beside this study's (the report's thresholds: Tukey's test between each node count and
    the next smaller), and the mean training time per cell divided by D."""
    trials = read_trials(study)
    lines = ["| nodes | against | paper: pays from (rows) | shoal: first faster at | shoal: faster from (rows) |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    analysis = analyze(trials)
    for found in analysis.thresholds:
        first = f"{found.first_size:,}" if found.first_size else "no size measured"
        ours = f"{found.from_size:,}" if found.from_size else "no size measured"
        paper = f"{PAPER_PAYS[found.workers]:,}" if found.workers in PAPER_PAYS else ""
        lines.append(f"| {found.workers} | {found.fewer} | {paper} | {first} | {ours} |")
    lines += unproven(analysis)
    cells: dict[tuple[int, int], list[float]] = {}
    for row in trials:
        cells.setdefault((row["rows"], row["workers"]), []).append(row["train_seconds"])
    sizes = sorted({size for size, _ in cells})
    table = ["| rows | " + " | ".join(f"{count} nodes" for count in nodes) + " |",
             "| ---: | " + " | ".join("---:" for _ in nodes) + " |"]
    for size in sizes:
        means = [sum(cells[size, count]) / len(cells[size, count]) / dilation if (size, count) in cells else None
                 for count in nodes]
        table.append(f"| {size:,} | " + " | ".join(f"{mean:.2f}" if mean is not None else "" for mean in means) + " |")
    return ("\n".join(lines) + "\n\nMean training seconds per cell, divided by D:\n\n" + "\n".join(table) + "\n\n"
            + plan_errors(study, trials))


def unproven(analysis) -> list[str]:
    """For a node count found faster at no size: at the largest size, its mean time against the next smaller
    count's and Tukey's adjusted p (the test pools every count's variance, the slowest's widest)."""
    largest = max(analysis.sizes, key=lambda size: size.rows)
    notes = []
    for found in analysis.thresholds:
        pair = next((item for item in largest.comparisons if (item.first, item.second) == (found.fewer, found.workers)),
                    None)
        if found.from_size is None and pair is not None:
            fewer, more = largest.cells[found.fewer].mean, largest.cells[found.workers].mean
            spread = max(cell.deviation or 0.0 for cell in largest.cells.values())
            notes.append(f"\nAt {largest.rows:,} rows {found.workers} nodes took {more:.1f} s (dilated) against "
                         f"{fewer:.1f} s on {found.fewer}, {fewer / more:.2f}x faster, but Tukey's adjusted p is "
                         f"{pair.p_value:.3f}: its test pools the variance of every node count, and the widest "
                         f"standard deviation there is {spread:.1f} s.")
    return notes


def earlier_profile(study: Path, earlier: Path, folder: Path) -> str:
    """The plan's table again from the earlier run's profile (kept in `folder` as profile-earlier.json): the
    same machine profiled twice, so how far the plan moves with its profile alone."""
    shutil.copy2(earlier / "profile.json", folder / "profile-earlier.json")
    mine, theirs = (load_profile(path).compute for path in (study / "profile.json", folder / "profile-earlier.json"))
    batch = json.loads((study / "study.json").read_text())["job"]["train"]["batch_size"]
    kept = {(row["size"], row["workers"], row["trial"]) for row in read_trials(earlier)}
    runs: dict[tuple[str, int, bool], list[float]] = {}
    for row in read_trials(study):
        runs.setdefault((row["size"], row["workers"], (row["size"], row["workers"], row["trial"]) in kept),
                        []).append(row["train_seconds"])
    ratios = [statistics.mean(runs[size, workers, False]) / statistics.mean(seconds)
              for (size, workers, old), seconds in runs.items() if old and (size, workers, False) in runs]
    return (f"\n## The same trials against the earlier run's profile\n\nThe machine was profiled again for this run. "
            f"The profile's real-loop factor at batch {batch} (a short one-worker job's step over the probed step) "
            f"read {mine.loop_factors[batch]:.2f} now and {theirs.loop_factors[batch]:.2f} in the earlier run, its "
            f"probed step {mine.step_seconds[batch] * 1e3:.2f} and {theirs.step_seconds[batch] * 1e3:.2f} ms, while "
            f"the trials of both runs agree: per cell measured in both, the mean training time of this run's trials "
            f"over the earlier run's is {statistics.median(ratios):.2f} (median of {len(ratios)} cells; "
            f"{min(ratios):.2f} to {max(ratios):.2f}). From the earlier profile (profile-earlier.json):\n\n"
            + plan_errors(study, read_trials(study), folder / "profile-earlier.json"))


def counterpart_text(dilation: int, trials: int, compared: str) -> str:
    return f"""# Kennedy et al. beside shoal: from which size more nodes pay

The paper: Medicare Part B claims, Keras on 1-16 commodity nodes, 20 trials a cell. shoal: the same worker
(examples/claims-kennedy.toml) on synthetic claims, 16 emulated hosts dilated by {dilation}, {trials}
trials a cell (report.md: the ANOVA tables, Tukey's groups, the box plots and the plan's predictions). A node
count pays from the smallest size at which Tukey's test finds it faster than the next smaller count, there and at
every larger size measured (the paper reads its sizes off Tukey's groups, its Table 2).

{compared}"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="synthetic claims rows to draw the sizes from")
    parser.add_argument("--ratios", default="1:1,1:5,1:10,1:50,1:100,1:400")
    parser.add_argument("--nodes", default="1,2,4,8,16")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--dilation", type=int, default=8)
    parser.add_argument("--resume", type=Path, help="a result folder of this study whose trials are kept: only the "
                        "missing ones run (its report says how many came from each run)")
    args = parser.parse_args(argv)
    require_cluster("benchmarks.seeds_kennedy", HOSTS, args.dilation)
    nodes = [int(count) for count in args.nodes.split(",")]
    folder = RESULTS / f"{date.today().isoformat()}-{hardware_tag()}-seeds-kennedy"
    began = time.monotonic()
    with EmulatedCluster(hosts=HOSTS, rate="1gbit", dilation=args.dilation) as cluster:
        job = write_job(cluster.shared, args.rows, args.epochs)
        kept = len(read_trials(args.resume)) if args.resume else 0
        out = run_study(cluster, job, ["--ratios", args.ratios], args.nodes, args.trials, args.dilation, folder,
                        earlier=args.resume)
        compared = counterpart(out, nodes, args.dilation)
        if args.resume is not None:
            compared += earlier_profile(out, args.resume, folder)
    minutes = (time.monotonic() - began) / 60
    note = how_made("seeds_kennedy", minutes, args.dilation,
                    f"examples/claims-kennedy.toml on {args.rows:,} synthetic claims under-sampled to {args.ratios}, "
                    f"on {args.nodes} hosts (1 worker, 1 thread each), {args.trials} trials per cell, {args.epochs} "
                    f"epochs.{resumed(args.resume, kept)}")
    write_results(folder, counterpart_text(args.dilation, args.trials, compared), note)
    print(f"results: {folder}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
