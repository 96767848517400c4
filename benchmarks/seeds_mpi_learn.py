"""mpi_learn's experiments at its scale: Downpour's speedup and accuracy against workers, and validation's cost.

mpi_learn (Downpour SGD under MPI, one master and N workers) reports its speedup against workers (Figs. 3-4:
near-linear to about 15 workers, then flattening as the master saturates), and that validating often on the
master costs speed. Here examples/sequences-lstm.toml (its LSTM(20) + softmax(3) on the sequences `shoal data
synth sequences` makes) trains with Downpour on the emulated cluster of 17 hosts dilated by D = 9
(tests/cluster/hosts.py: each host 1/9 of a core and of a 1 Gbit/s link; 17 hosts on 2 cores): the server on
host0, one trainer on each of the next N hosts, for N in 1, 2, 4, 8, 16. Per N: the median epoch over the
later epochs (seconds divided by D), the speedup over one trainer, the test accuracy after the last epoch.
Then at 1 and 8 trainers the same job validating on the server every 10 and every 50 updates
(`train.validate_every`), and the speedup at each frequency.

    .venv/bin/python -m benchmarks.seeds_mpi_learn       # about 25 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tests.cluster.hosts import EmulatedCluster
from tests.cluster.jobs import log_of, start_on_every_host

from benchmarks.common import ROOT, WORK, later_median, machine, machine_line, require_cluster, write_result
from benchmarks.seeds import environment, synth
from shoal.events import Validation, read_history

EXAMPLE = ROOT / "examples" / "sequences-lstm.toml"
HOSTS = 17
# what the project records of mpi_learn's scaling (benchmarks/results/2026-11-23-papers-plan.md); its figures'
# points could not be read, so no point is invented beside shoal's
SEED = "a speedup of about 30 at 60 GPU workers (as benchmarks/results/2026-11-23-papers-plan.md records it)"


def make_data(rows: int) -> tuple[Path, Path]:
    folder = WORK / "sequences"
    return synth("sequences", rows, 1, folder / f"train-{rows}"), synth("sequences", 20_000, 2, folder / "test-20000")


def write_job(folder: Path, train: Path, test: Path, epochs: int, validate_every: int, dilation: int,
              batch_size: int = 100) -> Path:
    job = EXAMPLE.read_text().replace('train = "data/sequences/train"', f'train = "{train}"')
    job = job.replace("batch_size = 100", f"batch_size = {batch_size}")
    job = job.replace('test = "data/sequences/test"', f'test = "{test}"').replace("epochs = 5", f"epochs = {epochs}")
    job = job.replace("seed = 0\n", f"seed = 0\nvalidate_every = {validate_every}\n")
    job += (f"\n[cluster]\nthreads = 1\ntimeout = {300 * dilation}\n\n[checkpoint]\nevery = 0\n\n"
            "[output]\nprogress = \"none\"\n")
    path = folder / f"lstm-{validate_every}-{batch_size}.toml"
    path.write_text(job)
    return path


def train(cluster: EmulatedCluster, job: Path, trainers: int, name: str, dilation: int) -> dict:
    """The job on host0 (the server) and `trainers` more hosts: its later epochs' median and its accuracy."""
    run_dir = cluster.shared / name
    launchers = start_on_every_host(cluster, str(job), run_dir, environment(), nodes=trainers + 1)
    for host, launcher in enumerate(launchers):
        if launcher.wait(timeout=7200) != 0:
            raise RuntimeError(f"{name} host {host}: {log_of(cluster, run_dir, host)[-2000:]}")
    history = read_history(run_dir)
    epochs, validations = history.epochs, history.of(Validation)
    seconds = [epoch.seconds for epoch in epochs]
    # validations run one at a time beside the serving thread: how many ran, and how long each took, say
    # whether they ran back to back (then a higher frequency costs nothing more)
    return {"trainers": trainers, "epoch_seconds": later_median(seconds) / dilation, "epochs": seconds,
            "accuracy": epochs[-1].test.get("accuracy"), "validations": len(validations),
            "validation_seconds": sum(item.seconds for item in validations) / dilation}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32_000)
    parser.add_argument("--trainers", default="1,2,4,8,16")
    parser.add_argument("--validation-trainers", default="1,8")
    parser.add_argument("--validate-every", default="10,50")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--dilation", type=int, default=9)
    args = parser.parse_args(argv)
    require_cluster("benchmarks.seeds_mpi_learn", HOSTS, args.dilation)
    train_data, test_data = make_data(args.rows)
    began = time.monotonic()
    runs, validated = [], []
    with EmulatedCluster(hosts=HOSTS, rate="1gbit", dilation=args.dilation) as cluster:
        plain = write_job(cluster.shared, train_data, test_data, args.epochs, 0, args.dilation)
        for trainers in (int(count) for count in args.trainers.split(",")):
            runs.append(train(cluster, plain, trainers, f"plain-{trainers}", args.dilation))
            print(runs[-1], flush=True)
        for every in (int(value) for value in args.validate_every.split(",")):
            job = write_job(cluster.shared, train_data, test_data, args.epochs, every, args.dilation)
            for trainers in (int(count) for count in args.validation_trainers.split(",")):
                validated.append({**train(cluster, job, trainers, f"every-{every}-{trainers}", args.dilation),
                                  "validate_every": every})
                print(validated[-1], flush=True)
    one = next(run for run in runs if run["trainers"] == 1)["epoch_seconds"]
    lines = ["| trainers | epoch s (/ D) | speedup | test accuracy |", "| ---: | ---: | ---: | ---: |"]
    for run in runs:
        run["speedup"] = one / run["epoch_seconds"]
        lines.append(f"| {run['trainers']} | {run['epoch_seconds']:.2f} | {run['speedup']:.2f} | "
                     f"{run['accuracy']:.3f} |")
    rows = ["| validate every | trainers | epoch s (/ D) | speedup over 1 trainer at that frequency | validations | "
            "validating s (/ D) | share of training |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run in validated:
        base = next(other for other in validated if other["validate_every"] == run["validate_every"]
                    and other["trainers"] == 1)["epoch_seconds"]
        run["speedup"] = base / run["epoch_seconds"]
        busy = run["validation_seconds"] / (sum(run["epochs"]) / args.dilation)
        rows.append(f"| {run['validate_every']} updates | {run['trainers']} | {run['epoch_seconds']:.2f} | "
                    f"{run['speedup']:.2f} | {run['validations']} | {run['validation_seconds']:.2f} | {busy:.0%} |")
    rows += [f"| never | {run['trainers']} | {run['epoch_seconds']:.2f} | {run['speedup']:.2f} | 0 | 0 | 0% |"
             for run in runs if str(run["trainers"]) in args.validation_trainers.split(",")]
    info = machine()
    markdown = f"""# mpi_learn beside shoal: Downpour's speedup and accuracy against workers

{machine_line(info)}. examples/sequences-lstm.toml (LSTM(20) + softmax(3), Downpour, Adam, batch 100) on
{args.rows:,} rows of `shoal data synth sequences` (test: 20,000 rows of another seed), {args.epochs} epochs; the
emulated cluster of {HOSTS} hosts dilated by D = {args.dilation} (1/{args.dilation} of a core and of a 1 Gbit/s link
each, a keeper on each core), the server on host0 and one trainer a host. Epoch: the median of the later half of
the epochs, divided by D. `python -m benchmarks.seeds_mpi_learn` ({(time.monotonic() - began) / 60:.0f} minutes).

mpi_learn (Figs. 3-4): {SEED}.

{chr(10).join(lines)}

Validation on the server (`train.validate_every`) against speed (mpi_learn: frequent validation costs speedup).
A validation runs in a thread beside the server's, one at a time (one due while another runs is skipped), so
its cost follows the share of the training time a validation was running: at 100% more frequent validation
costs nothing more.

{chr(10).join(rows)}
"""
    path = write_result("seeds-mpi-learn", markdown, {"machine": info, "arguments": vars(args), "runs": runs,
                                                      "validated": validated})
    print(markdown)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
