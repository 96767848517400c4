"""cNeural's figures at its scale: load time and epoch time against 1-16 machines for 0.5, 1 and 2 million rows.

cNeural (a 784-40-10 sigmoid perceptron on MNIST-shaped rows, batch-mode backpropagation on 1 GbE) loads its data
once into the machines' memory and reads it every epoch, and shows load time against machines for 0.5M, 1M and 2M
rows, the share of the job spent loading against the number of epochs, and epoch time against machines. Here
`shoal bench scaling` runs the same workload in cNeural's batch mode (`accumulate = "epoch"`: each machine's whole
share summed into one gradient, one all-reduce and one step an epoch) on the emulated cluster of 16 hosts dilated
by D = 8 (tests/cluster/hosts.py), one worker a host, after `shoal plan` has measured the profile on two hosts so
that the report sets the plan's prediction beside each cell. Load time is the slowest worker's reading of its
share (`data_loaded`); epoch time is the training time over the epochs. counterpart.md divides by D.

    .venv/bin/python -m benchmarks.seeds_cneural         # about 30 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import date
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot  # noqa: E402
from tests.cluster.hosts import EmulatedCluster  # noqa: E402

from benchmarks.common import RESULTS, WORK, hardware_tag, require_cluster  # noqa: E402
from benchmarks.seeds import HOSTS, how_made, plan_errors, resumed, run_study, synth, write_results  # noqa: E402
from shoal.bench.study import read_trials  # noqa: E402

# cNeural's published anchors (its one-machine epoch; its abstract's claim) and what `shoal plan` made of them on
# the paper's cluster (benchmarks/results/2026-11-23-papers-plan.md); the figures' points could not be read
PAPER_EPOCH_ONE_MACHINE = 36.3  # seconds per epoch of 1M rows on one 8-core machine
PAPER_PLAN = {1: 36.302, 2: 18.155, 4: 9.081, 8: 4.543, 16: 2.277}
EPOCH_COUNTS = (1, 2, 5, 10, 20, 50, 100)


def write_job(folder: Path, train: Path, epochs: int) -> Path:
    path = folder / "cneural.toml"
    path.write_text(f"""# cNeural's workload in its batch mode
[model]
input = [784]
layers = [{{ dense = 40, activation = "sigmoid" }}, {{ dense = 10 }}]
[data]
train = "{train}"
[algorithm]
name = "sync"
[train]
epochs = {epochs}
batch_size = 1000
accumulate = "epoch"
optimizer = {{ name = "sgd", lr = 0.5 }}
loss = "cross_entropy"
""")
    return path


def digits(rows: int) -> Path:
    """`rows` synthetic digits, made once under benchmarks/work/cneural."""
    return synth("digits", rows, 1, WORK / "cneural" / f"digits-{rows}")


def cells(trials: list[dict], dilation: int) -> dict[tuple[int, int], dict]:
    """(rows, nodes) -> mean load seconds and mean epoch seconds over the trials, divided by D."""
    found: dict[tuple[int, int], list[dict]] = {}
    for row in trials:
        found.setdefault((row["rows"], row["workers"]), []).append(row)
    return {key: {"load": sum(row["load_seconds"] for row in rows) / len(rows) / dilation,
                  "epoch": sum(row["train_seconds"] / row["epochs"] for row in rows) / len(rows) / dilation}
            for key, rows in found.items()}


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def table(measured: dict, sizes: list[int], nodes: list[int], what: str) -> str:
    lines = ["| rows | " + " | ".join(plural(count, "node") for count in nodes) + " |",
             "| ---: | " + " | ".join("---:" for _ in nodes) + " |"]
    for size in sizes:
        one = measured.get((size, nodes[0]), {}).get(what)
        values = []
        for count in nodes:
            value = measured.get((size, count), {}).get(what)
            speedup = f" ({one / value:.1f}x)" if value and one and count != nodes[0] else ""
            values.append(f"{value:.2f}{speedup}" if value is not None else "")
        lines.append(f"| {size:,} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def load_shares(measured: dict, sizes: list[int], nodes: list[int]) -> str:
    """The share of load + E epochs spent loading, from the measured load and epoch time (cNeural's Fig. 6)."""
    lines = ["| rows | nodes | " + " | ".join(plural(count, "epoch") for count in EPOCH_COUNTS) + " |",
             "| ---: | ---: | " + " | ".join("---:" for _ in EPOCH_COUNTS) + " |"]
    for size in sizes:
        for count in (nodes[0], nodes[-1]):
            cell = measured.get((size, count))
            if cell:
                shares = [cell["load"] / (cell["load"] + epochs * cell["epoch"]) for epochs in EPOCH_COUNTS]
                lines.append(f"| {size:,} | {count} | " + " | ".join(f"{share:.0%}" for share in shares) + " |")
    return "\n".join(lines)


def plot_shares(measured: dict, sizes: list[int], nodes: list[int], path: Path) -> None:
    figure, axes = pyplot.subplots(figsize=(6, 4))
    for color, size in enumerate(sizes):
        for count, style in ((nodes[0], "-"), (nodes[-1], "--")):
            cell = measured.get((size, count))
            if cell:
                shares = [cell["load"] / (cell["load"] + epochs * cell["epoch"]) for epochs in EPOCH_COUNTS]
                axes.plot(EPOCH_COUNTS, shares, style, color=f"C{color}", marker="o",
                          label=f"{size:,} rows, {plural(count, 'node')}")
    axes.set_xscale("log")
    axes.set_xlabel("epochs")
    axes.set_ylabel("share of load + training spent loading")
    axes.set_title("load share against epochs")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def counterpart(study: Path, folder: Path, sizes: list[int], nodes: list[int], dilation: int) -> str:
    trials = read_trials(study)
    measured = cells(trials, dilation)
    plot_shares(measured, sizes, nodes, folder / "load-share.png")
    one_million = measured.get((1_000_000, 1), {}).get("epoch")
    paper = " | ".join(f"{PAPER_PLAN[count]:.2f}" for count in nodes if count in PAPER_PLAN)
    anchor = (f"shoal's one host at 1,000,000 rows: {one_million:.2f} s an epoch (one core; cNeural's machine had 8)."
              if one_million else "")
    return f"""## Load time against machines (cNeural's Fig. 5)

The slowest worker's reading of its share (seconds / D; in brackets, 1 node's time over this one's). load.png
draws it.

{table(measured, sizes, nodes, "load")}

## Load share against epochs (cNeural's Fig. 6)

Load / (load + E epochs), from each cell's measured load and mean epoch (load-share.png): 1 node and
{nodes[-1]} nodes.

{load_shares(measured, sizes, nodes)}

## Epoch time against machines (cNeural's Fig. 7)

Mean seconds an epoch, divided by D (in brackets, the speedup over 1 node).

{table(measured, sizes, nodes, "epoch")}

cNeural: {PAPER_EPOCH_ONE_MACHINE} s an epoch of 1M rows on one 8-core machine, and "nearly linear scalability"
to 36 machines; the figures' points could not be read. What `shoal plan` predicted for the paper's cluster from
its one-machine time (2026-11-23-papers-plan.md), s an epoch at {", ".join(str(count) for count in nodes)}
machines: {paper}. {anchor}

{plan_errors(study, trials)}"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500000,1000000,2000000")
    parser.add_argument("--nodes", default="1,2,4,8,16")
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--dilation", type=int, default=8)
    parser.add_argument("--resume", type=Path, help="a result folder of this study whose trials are kept: only the "
                        "missing ones run (its report says how many came from each run)")
    args = parser.parse_args(argv)
    require_cluster("benchmarks.seeds_cneural", HOSTS, args.dilation)
    sizes = sorted(int(size) for size in args.sizes.split(","))
    nodes = [int(count) for count in args.nodes.split(",")]
    folder = RESULTS / f"{date.today().isoformat()}-{hardware_tag()}-seeds-cneural"
    began = time.monotonic()
    train = digits(sizes[-1])
    with EmulatedCluster(hosts=HOSTS, rate="1gbit", dilation=args.dilation) as cluster:
        job = write_job(cluster.shared, train, args.epochs)
        kept = len(read_trials(args.resume)) if args.resume else 0
        out = run_study(cluster, job, ["--sizes", args.sizes], args.nodes, args.trials, args.dilation, folder,
                        earlier=args.resume)
        compared = counterpart(out, folder, sizes, nodes, args.dilation)
    minutes = (time.monotonic() - began) / 60
    note = how_made("seeds_cneural", minutes, args.dilation,
                    f"a 784-40-10 sigmoid perceptron in batch mode on {', '.join(f'{size:,}' for size in sizes)} "
                    f"synthetic digit rows, on {args.nodes} hosts (1 worker, 1 thread each), "
                    f"{plural(args.trials, 'trial')} per cell, {plural(args.epochs, 'epoch')}."
                    f"{resumed(args.resume, kept)}")
    write_results(folder, f"# cNeural beside shoal: load and epoch time against machines\n\n{compared}", note)
    print(f"results: {folder}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
