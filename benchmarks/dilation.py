"""The error of time dilation: the same 2-host job undilated and dilated, per algorithm.

A cluster of more hosts than cores is emulated by slowing every host by one factor D (tests/cluster/hosts.py:
1/D of a core through a cgroup's CPU quota, the link at 1/D of its rate) and dividing the times measured by D.
This checks that estimate where it can be checked: on 2 hosts, each with a core of its own undilated, the
median of the later epochs' seconds (the first ones overlap the dilated start-up's tail) undilated against
the dilated run's divided by D, for sync, averaging, Downpour and
EASGD on cNeural's 784-40-10 perceptron over 1 Gbit/s, the runs of each algorithm alternated. Its goal: the
ratio within 15% of 1 for every algorithm. What dilation cannot slow (the kernel's per-message cost, a waiting
process's wake-up) makes a dilated exchange relatively cheaper, so a ratio below 1 on a chatty algorithm is
expected; the table says by how much.

    .venv/bin/python -m benchmarks.dilation            # about 15 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tests.cluster.hosts import SLICE_MS, EmulatedCluster
from tests.cluster.jobs import log_of, start_on_two_hosts

from benchmarks import comm
from benchmarks.common import WORK, later_median, machine, machine_line, require_cluster, write_result
from shoal.data.synthetic import synth_digits
from shoal.events import read_history

ALGORITHMS = ("sync", "averaging", "downpour", "easgd")
GOAL = 0.15


def write_job(algorithm: str, train, batch: int, epochs: int):
    path = WORK / f"dilation-{algorithm}.toml"
    period = '\nperiod = 8' if algorithm == "easgd" else ""
    path.write_text(f"""
[model]
input = [784]
layers = [{{ dense = 40, activation = "sigmoid" }}, {{ dense = 10 }}]
[data]
train = "{train}"
[algorithm]
name = "{algorithm}"{period}
[train]
epochs = {epochs}
batch_size = {batch}
optimizer = {{ name = "sgd", lr = 0.5, momentum = 0.9 }}
[checkpoint]
every = 0
[cluster]
threads = 1
timeout = 900
[output]
progress = "none"
""")
    return path


def later_epochs(cluster: EmulatedCluster, job, name: str) -> float:
    """The median seconds of the later half of `job`'s epochs on the cluster's 2 hosts, 1 worker each."""
    run_dir = cluster.shared / name
    launchers = start_on_two_hosts(cluster, str(job), run_dir, comm.environment())
    for host, launcher in enumerate(launchers):
        if launcher.wait(timeout=3600) != 0:
            raise RuntimeError(f"host {host}: {log_of(cluster, run_dir, host)[-2000:]}")
    return later_median([epoch.seconds for epoch in read_history(run_dir).epochs])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--dilation", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--slice-ms", type=int, default=SLICE_MS, help="a host's turn on its core")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    args = parser.parse_args(argv)
    require_cluster("benchmarks.dilation", 2)
    require_cluster("benchmarks.dilation", 2, args.dilation)
    train = WORK / f"digits-{args.rows}"
    if not train.exists():
        synth_digits(str(train), args.rows, seed=1)
    began = time.monotonic()
    results = {}
    for algorithm in args.algorithms.split(","):
        job = write_job(algorithm, train, args.batch_size, args.epochs)
        runs = {"undilated": [], "dilated": []}
        for round_number in range(args.rounds):
            # one cluster at a time: the dilated one's keepers would fill the undilated hosts' idle time
            with EmulatedCluster(hosts=2) as plain:
                runs["undilated"].append(later_epochs(plain, job, f"{algorithm}-plain-{round_number}"))
            with EmulatedCluster(hosts=2, dilation=args.dilation, slice_ms=args.slice_ms) as dilated:
                runs["dilated"].append(later_epochs(dilated, job, f"{algorithm}-dilated-{round_number}")
                                       / args.dilation)
            print(f"{algorithm} round {round_number + 1}: {runs['undilated'][-1]:.2f} s undilated, "
                  f"{runs['dilated'][-1]:.2f} s dilated / {args.dilation}", flush=True)
        ratio = statistics.median(runs["dilated"]) / statistics.median(runs["undilated"])
        results[algorithm] = {**runs, "ratio": ratio, "met": abs(ratio - 1) <= GOAL}
    info = machine()
    lines = ["| algorithm | undilated s/epoch | dilated s/epoch / D | ratio | within 15% |",
             "| --- | ---: | ---: | ---: | --- |"]
    for algorithm, row in results.items():
        lines.append(f"| {algorithm} | {' '.join(f'{value:.2f}' for value in row['undilated'])} | "
                     f"{' '.join(f'{value:.2f}' for value in row['dilated'])} | {row['ratio']:.3f} | "
                     f"{'yes' if row['met'] else 'no'} |")
    markdown = f"""# Time dilation's error at 2 hosts

{machine_line(info)}; 2 emulated hosts (network namespaces, 1 worker and 1 thread each) on 1 Gbit/s, undilated
(a core each) and dilated by D = {args.dilation} (each host 1/{args.dilation} of a core, {args.slice_ms} ms of CPU in
every {args.slice_ms * args.dilation} ms, a keeper on each core, its link at 1/{args.dilation} of the rate). 784-40-10
perceptron, {args.rows:,} digit rows, batch {args.batch_size}, SGD; the median of the later half of {args.epochs}
epochs, {args.rounds} alternated rounds; the ratio compares medians. `.venv/bin/python -m benchmarks.dilation`
({(time.monotonic() - began) / 60:.1f} minutes).

{chr(10).join(lines)}
"""
    path = write_result("dilation", markdown, {"machine": info, "arguments": vars(args), "results": results})
    print(markdown)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
