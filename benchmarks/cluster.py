"""Two machines on a shaped link: seconds per epoch, split into compute and communication.

On the emulated cluster (tests/cluster/hosts.py: network namespaces, each host its own core,
a tbf-shaped link), 2 hosts x 1 worker train cNeural's 784-40-10 perceptron on 200k digit rows
with sync (an all-reduce every step) and averaging (one exchange per epoch), at batch 128 and
1024, over links of 1 Gbit/s, 100 Mbit/s and 10 Mbit/s; beside them, the same job with 2
workers on this machine over loopback. The second epoch is reported (the first warms up).
Needs root, `ip` and `tc`, and 2 cores.

    .venv/bin/python -m benchmarks.cluster            # about 6 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from tests.cluster.hosts import EmulatedCluster, missing_requirements
from tests.cluster.jobs import log_of, start_on_two_hosts

from benchmarks.common import ROOT, WORK, machine, machine_line, shoal_train, write_result
from shoal.data.synthetic import synth_digits
from shoal.events import read_history

RATES = ("1gbit", "100mbit", "10mbit")
ALGORITHMS = ("sync", "averaging")
BATCHES = (128, 1024)


def write_job(folder: Path, train: Path, algorithm: str, batch: int) -> Path:
    path = folder / f"{algorithm}-{batch}.toml"
    path.write_text(f"""
[model]
input = [784]
layers = [{{ dense = 40, activation = "sigmoid" }}, {{ dense = 10 }}]
[data]
train = "{train}"
[algorithm]
name = "{algorithm}"
[train]
epochs = 2
batch_size = {batch}
optimizer = {{ name = "sgd", lr = 0.5, momentum = 0.9 }}
[checkpoint]
every = 0
[cluster]
threads = 1
timeout = 600
[output]
progress = "none"
""")
    return path


def second_epoch(run_dir: Path) -> dict:
    epoch = read_history(run_dir).epochs[-1]
    split = epoch.seconds_split
    return {"seconds": epoch.seconds, "compute": split.compute, "communication": split.communication,
            "data": split.data}


def on_two_hosts(cluster: EmulatedCluster, job: Path, name: str) -> dict:
    run_dir = cluster.shared / name
    launchers = start_on_two_hosts(cluster, str(job), run_dir, dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}"))
    for host, launcher in enumerate(launchers):
        if launcher.wait(timeout=1800) != 0:
            raise RuntimeError(f"host {host}: {log_of(cluster, run_dir, host)[-2000:]}")
    return second_epoch(run_dir)


def on_one_host(job: Path, name: str) -> dict:
    run_dir = WORK / "cluster" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    shoal_train(job, run_dir, "--workers", "2")
    return second_epoch(run_dir)


def table(rows: list[dict]) -> str:
    lines = ["| link | algorithm | batch | s/epoch | compute | communication | one host s/epoch | one host comm. |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        two, one = row["two_hosts"], row["one_host"]
        lines.append(f"| {row['rate']} | {row['algorithm']} | {row['batch']} | {two['seconds']:.2f} | "
                     f"{two['compute']:.2f} | {two['communication']:.2f} | {one['seconds']:.2f} | "
                     f"{one['communication']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rates", default=",".join(RATES))
    args = parser.parse_args()
    reason = missing_requirements(2)
    if reason:
        sys.exit(f"benchmarks.cluster: {reason}")
    train = WORK / f"digits-{args.rows}"
    if not train.exists():
        synth_digits(train, args.rows, seed=1)
    jobs = {(algorithm, batch): write_job(WORK, train, algorithm, batch) for algorithm in ALGORITHMS
            for batch in BATCHES}
    one_host = {key: on_one_host(job, f"{key[0]}-{key[1]}") for key, job in jobs.items()}
    rows, began = [], time.monotonic()
    for rate in args.rates.split(","):
        with EmulatedCluster(hosts=2, rate=rate) as cluster:
            for (algorithm, batch), job in jobs.items():
                two = on_two_hosts(cluster, job, f"{algorithm}-{batch}-{rate}")
                rows.append({"rate": rate, "algorithm": algorithm, "batch": batch, "two_hosts": two,
                             "one_host": one_host[(algorithm, batch)]})
                print(f"{rate} {algorithm} {batch}: {two['seconds']:.2f} s/epoch "
                      f"({two['communication']:.2f} s communication)", flush=True)
    info = machine()
    markdown = f"""# Two machines on a shaped link

{machine_line(info)}; the emulated cluster: 2 network namespaces on a bridge, each host pinned to
its own core with 1 worker and 1 thread, its link shaped with `tc tbf` (no added latency: this
kernel has no netem). 784-40-10 perceptron, {args.rows:,} digit rows, SGD; the second of two
epochs. "One host": the same job with 2 workers on this machine over loopback.
`.venv/bin/python -m benchmarks.cluster` ({time.monotonic() - began:.0f} s for the two-host runs).

{table(rows)}
"""
    path = write_result("cluster", markdown, {"machine": info, "rows": args.rows, "results": rows})
    print(markdown)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
