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

    .venv/bin/python -m benchmarks.seeds_kennedy         # about 45 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from tests.cluster.hosts import EmulatedCluster

from benchmarks import comm
from benchmarks.common import RESULTS, ROOT, hardware_tag, machine_line, require_cluster
from benchmarks.scaling import write_claims_job
from shoal.bench.analysis import analyze
from shoal.bench.prediction import predict_cells
from shoal.bench.study import read_trials
from shoal.plan.profile import load_profile

EXAMPLE = ROOT / "examples" / "claims-kennedy.toml"
HOSTS = 16
# the paper's sizes (rows) from which 2, 8 and 16 nodes paid (its Table 2 and Figure 4)
PAPER_PAYS = {2: 6_720, 8: 57_120, 16: 1_121_120}
PLAN_GOAL, PLAN_SHARE = 0.25, 0.80
COPIED = ("report.md", "trials.csv", "anova.csv", "anova-two-way.csv", "tukey.csv", "study.json")


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


def environment() -> dict:
    return comm.environment(OMP_NUM_THREADS="1")


def save_profile(cluster: EmulatedCluster, job: Path, remote: str) -> Path:
    """`shoal plan --hosts host0,host1 --save-profile` run on host0: a dilated host's compute and link."""
    profile = cluster.shared / "profile.json"
    cluster.run(0, [sys.executable, "-m", "shoal", "plan", str(job), "--hosts", "host0,host1", "--save-profile",
                    str(profile), "--set", f"cluster.remote={remote}"], env=environment(), timeout=1800)
    return profile


def counterpart(study: Path, nodes: list[int], dilation: int) -> str:
    """The paper's sizes beside this study's (the report's thresholds: Tukey's test between each node count and
    the next smaller), and the mean training time per cell divided by D."""
    trials = read_trials(study)
    lines = ["| nodes | against | paper: pays from (rows) | shoal: first faster at | shoal: faster from (rows) |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    for found in analyze(trials).thresholds:
        first = f"{found.first_size:,}" if found.first_size else "no size measured"
        ours = f"{found.from_size:,}" if found.from_size else "no size measured"
        paper = f"{PAPER_PAYS[found.workers]:,}" if found.workers in PAPER_PAYS else ""
        lines.append(f"| {found.workers} | {found.fewer} | {paper} | {first} | {ours} |")
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


def plan_errors(study: Path, trials: list[dict]) -> str:
    """How far the plan's prediction (from the profile saved in `study`) is from each measured cell at 4 or more
    nodes: the count within PLAN_GOAL, against the goal of PLAN_SHARE of the cells."""
    cells = predict_cells(json.loads((study / "study.json").read_text()), analyze(trials), trials,
                          load_profile(study / "profile.json"))
    judged = [cell for cell in cells if cell.nodes >= 4]
    within = [cell for cell in judged if abs(cell.predicted / cell.measured - 1) <= PLAN_GOAL]
    lines = ["| rows | nodes | measured s | predicted s | predicted / measured |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {cell.rows:,} | {cell.nodes} | {cell.measured:.3f} | {cell.predicted:.3f} | "
              f"{cell.predicted / cell.measured:.2f} |" for cell in judged]
    share = len(within) / len(judged)
    verdict = "met" if share >= PLAN_SHARE else "missed"
    return (f"The plan at 4 to 16 nodes (dilated seconds; the ratio does not change with D): {len(within)} of "
            f"{len(judged)} cells within {PLAN_GOAL:.0%} ({share:.0%}; goal {PLAN_SHARE:.0%}: {verdict}).\n\n"
            + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="synthetic claims rows to draw the sizes from")
    parser.add_argument("--ratios", default="1:1,1:5,1:10,1:50,1:100")
    parser.add_argument("--nodes", default="1,2,4,8,16")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dilation", type=int, default=8)
    args = parser.parse_args(argv)
    require_cluster("benchmarks.seeds_kennedy", HOSTS, args.dilation)
    nodes = [int(count) for count in args.nodes.split(",")]
    folder = RESULTS / f"{date.today().isoformat()}-{hardware_tag()}-seeds-kennedy"
    began = time.monotonic()
    with EmulatedCluster(hosts=HOSTS, rate="1gbit", dilation=args.dilation) as cluster:
        job = write_job(cluster.shared, args.rows, args.epochs)
        remote = f"'{cluster.enter} {{host}}'"
        profile = save_profile(cluster, job, remote)
        out = cluster.shared / "study"
        hosts = ",".join(cluster.hostname(host) for host in range(HOSTS))
        subprocess.run([sys.executable, "-m", "shoal", "bench", "scaling", str(job), "--ratios", args.ratios,
                        "--workers", "1", "--hosts", hosts, "--nodes", args.nodes, "--trials", str(args.trials),
                        "--out", str(out), "--no-progress", "--profile", str(profile),
                        "--set", f"cluster.remote={remote}", "--set", f"cluster.timeout={300 * args.dilation}"],
                       check=True, env=environment(), cwd=ROOT)
        folder.mkdir(parents=True, exist_ok=True)
        for name in (*COPIED, *(path.name for path in out.glob("*.png"))):
            if (out / name).exists():
                shutil.copy2(out / name, folder / name)
        shutil.copy2(profile, folder / "profile.json")
        shutil.copy2(profile, out / "profile.json")
        compared = counterpart(out, nodes, args.dilation)
    minutes = (time.monotonic() - began) / 60
    note = (f"\n## How this result was made\n\n`python -m benchmarks.seeds_kennedy` ({minutes:.0f} minutes) on "
            f"{machine_line()}: the emulated cluster of {HOSTS} hosts dilated by D = {args.dilation} (each host "
            f"1/{args.dilation} of a core and of a 1 Gbit/s link); examples/claims-kennedy.toml on {args.rows:,} "
            f"synthetic claims under-sampled to {args.ratios}, on {args.nodes} hosts (1 worker, 1 thread each), "
            f"{args.trials} trials per cell, {args.epochs} epochs. Seconds are the dilated cluster's; divide by "
            f"{args.dilation} for the machines it stands for (counterpart.md does).\n")
    with open(folder / "report.md", "a", encoding="utf-8") as handle:
        handle.write(note)
    (folder / "counterpart.md").write_text(f"""# Kennedy et al. beside shoal: from which size more nodes pay

The paper: Medicare Part B claims, Keras on 1-16 commodity nodes, 20 trials a cell. shoal: the same worker
(examples/claims-kennedy.toml) on synthetic claims, 16 emulated hosts dilated by {args.dilation}, {args.trials}
trials a cell (report.md: the ANOVA tables, Tukey's groups, the box plots and the plan's predictions). A node
count pays from the smallest size at which Tukey's test finds it faster than the next smaller count, there and at
every larger size measured (the paper reads its sizes off Tukey's groups, its Table 2).

{compared}{note}""")
    print(f"results: {folder}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
