"""Unequal machines: seconds per epoch with equal and with speed shares (cluster.balance), against the ideal.

On the emulated cluster (tests/cluster/hosts.py: network namespaces, a tbf-shaped 1 Gbit/s link
with a small bucket) the hosts do not get a core each: one training worker has core 0 to itself
and two share core 1, one worker per host, 1 thread each. Every algorithm trains cNeural's
784-40-10 perceptron on 90k synthetic digit rows (a 10k-row test set) for 5 epochs, once with
cluster.balance = "equal" and once with "speed", 2 trials each (train.seed 0 and 1, the same for
both balances, so the accuracies' spread is the run-to-run spread). Sync, averaging (period epoch) and synchronous EASGD
run on 3 hosts pinned to cores 0, 1, 1. Downpour and asynchronous EASGD hold a parameter server
on rank 0 that does not train: they run on 4 hosts, the server on host0 and the trainers on
host1 (core 0 alone), host2 and host3 (core 1, with the server), so their trainers stand as the
others' do.

Per run: the first epoch's seconds, the mean seconds of epochs 3..E (the shares have moved by
then), the ideal of those epochs (rows / the sum of the trainers' measured rates: every worker busy
to the end), their ratio, each trainer's last share and the final test accuracy. Needs root,
`ip`, `tc`, `taskset` and 2 cores.

With `--layout busy` the slow machine is one host beside a busy loop on its core (2 hosts, 3 with a
server): two hosts sharing a core are not independent machines (the one that gets the core first
looks fast, and shares sized by speed then follow the scheduler), a host beside a steady load is.

    .venv/bin/python -m benchmarks.uneven            # about 8 minutes on 2 cores
    .venv/bin/python -m benchmarks.uneven --layout busy
    .venv/bin/python -m benchmarks.uneven --quick    # averaging only, 10k rows, 3 epochs: under a minute
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster.hosts import EmulatedCluster, missing_requirements

from benchmarks.common import ROOT, WORK, machine, machine_line, write_result
from shoal.data.synthetic import synth_digits
from shoal.events import History, read_history

# name -> (algorithm.name, its options, whether rank 0 is a server that does not train)
ALGORITHMS = {
    "sync": ("sync", {}, False),
    "averaging": ("averaging", {"period": "epoch"}, False),
    "easgd-sync": ("easgd", {"synchronous": True}, False),
    "downpour": ("downpour", {"sync_every": 1, "synchronous": False}, True),
    "easgd-async": ("easgd", {"synchronous": False}, True),
}
BALANCES = ("equal", "speed")
NEVER_SLOWER = 1.02
"""Speed shares' epoch may be at most this many times equal shares' (the balancer takes back a losing move)."""
LAYOUTS = {
    # "shared": the slow hosts share a core with each other
    "shared": {"peers": (0, 1, 1), "with_server": (1, 0, 1, 1)},
    # "busy": the slow host shares its core with a busy loop, not with another worker
    "busy": {"peers": (0, 1), "with_server": (1, 0, 1)},
}
"""Each host's core (an index into this process's affinity), when every rank trains ("peers") and with a
server on host0 whose trainers stand as the peers do."""
BUSY_CORE = 1
"""With the "busy" layout: the core a busy loop shares with the slow host."""
LAYOUT_TEXT = {
    "shared": "Sync, averaging (period epoch) and synchronous EASGD: 3 hosts, host0 alone on core 0, host1 and "
              "host2 sharing core 1. Downpour and asynchronous EASGD (rank 0 a parameter server that does not "
              "train): 4 hosts, the server on host0 and the trainers host1 (core 0 alone), host2 and host3 "
              "(sharing core 1 with the server).",
    "busy": "Sync, averaging (period epoch) and synchronous EASGD: 2 hosts, host0 alone on core 0, host1 on "
            "core 1 beside a busy loop (a process spinning there all along). Downpour and asynchronous EASGD: "
            "3 hosts, the server on host0 (core 1), the trainers host1 (core 0 alone) and host2 (core 1, beside "
            "the busy loop and the server).",
}
STEADY_FROM = 3
"""The first epoch of the steady pace: epoch 1 measures, epoch 2 may still move the shares."""
SECONDS_LIMIT = 600


def prepare_digits(train_rows: int, test_rows: int) -> tuple[Path, Path]:
    """Synthetic digits drawn once into benchmarks/work: train with seed 1, test with seed 2 (one task)."""
    folder = WORK / "digits"
    folder.mkdir(parents=True, exist_ok=True)
    train, test = folder / f"train-{train_rows}", folder / f"test-{test_rows}"
    for out, rows, seed in ((train, train_rows, 1), (test, test_rows, 2)):
        if not out.exists():
            synth_digits(str(out), rows, seed=seed)
    return train, test


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def write_job(folder: Path, data: tuple[Path, Path], name: str, balance: str, epochs: int, batch: int,
              seed: int) -> Path:
    algorithm, options, _ = ALGORITHMS[name]
    option_lines = "".join(f"{key} = {toml_value(value)}\n" for key, value in options.items())
    path = folder / f"{name}-{balance}-{seed}.toml"
    path.write_text(f"""[model]
input = [784]
layers = [{{ dense = 40, activation = "sigmoid" }}, {{ dense = 10 }}]
[data]
train = "{data[0]}"
test = "{data[1]}"
[algorithm]
name = "{algorithm}"
{option_lines}[train]
epochs = {epochs}
batch_size = {batch}
optimizer = {{ name = "sgd", lr = 0.1, momentum = 0.5 }}
seed = {seed}
eval_every = {epochs}
[checkpoint]
every = 0
[cluster]
threads = 1
timeout = 300
balance = "{balance}"
[output]
progress = "none"
""")
    return path


def train_on_hosts(cluster: EmulatedCluster, job: Path, run_dir: Path) -> History:
    """`shoal train --hosts` from one terminal, one worker per host; its output in RUN.log beside the run."""
    hosts = ",".join(f"{cluster.hostname(host)}:1" for host in range(cluster.hosts))
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
    log = run_dir.with_suffix(".log")
    with open(log, "w") as output:
        done = subprocess.run([sys.executable, "-m", "shoal", "train", str(job), "--hosts", hosts, "--run-dir",
                               str(run_dir), "--set", f"cluster.remote='{cluster.enter} {{host}}'"], env=env,
                              cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, timeout=SECONDS_LIMIT)
    if done.returncode != 0:
        raise RuntimeError(f"exit status {done.returncode}: {log.read_text()[-1500:]}")
    return read_history(run_dir)


def summarize(history: History) -> dict:
    """Epoch 1, the steady epochs against their ideal, the shares and rates they ended on, the accuracy."""
    epochs = history.epochs
    steady = epochs[STEADY_FROM - 1:] or epochs[-1:]
    ideals = [epoch.samples / sum(worker.rate for worker in epoch.workers) for epoch in steady]
    seconds = statistics.mean(epoch.seconds for epoch in steady)
    last = epochs[-1]
    return {
        "first_epoch": epochs[0].seconds,
        "seconds_per_epoch": seconds,
        "ideal": statistics.mean(ideals),
        "ratio": seconds / statistics.mean(ideals),
        "communication": statistics.mean(epoch.seconds_split.communication for epoch in steady),
        "accuracy": last.test.get("accuracy"),
        "epochs": [{"seconds": epoch.seconds, "balance": epoch.balance, "next_shares": epoch.next_shares,
                    "workers": [{"host": worker.host, "rows": worker.rows, "rate": worker.rate,
                                 "share": worker.share} for worker in epoch.workers]} for epoch in epochs],
        "shares": [worker.share for worker in last.workers],
        "rates": [worker.rate for worker in last.workers],
    }


def run_all(args: argparse.Namespace, data: tuple[Path, Path]) -> list[dict]:
    """Every algorithm x balance x trial, the peers' on one cluster and the servers' on the other."""
    rows = []
    layout = LAYOUTS[args.layout]
    for server, pinning in ((False, layout["peers"]), (True, layout["with_server"])):
        names = [name for name in args.algorithms if ALGORITHMS[name][2] == server]
        if not names:
            continue
        with EmulatedCluster(hosts=len(pinning), rate=args.rate, cores=list(pinning)) as cluster, \
                busy_loop(args.layout == "busy"):
            for name in names:
                for trial in range(args.trials):
                    for balance in BALANCES:
                        job = write_job(cluster.shared, data, name, balance, args.epochs, args.batch_size, trial)
                        began = time.perf_counter()
                        row = {"algorithm": name, "balance": balance, "trial": trial + 1, "cores": list(pinning)}
                        try:
                            row.update(summarize(train_on_hosts(cluster, job, cluster.shared / job.stem)))
                        except (RuntimeError, subprocess.TimeoutExpired) as error:
                            row["failed"] = str(error)
                        row["wall_seconds"] = time.perf_counter() - began
                        rows.append(row)
                        print(line_of(row), flush=True)
    return rows


@contextlib.contextmanager
def busy_loop(wanted: bool):
    """A process spinning on BUSY_CORE for as long as the block runs: the slow host's other load."""
    if not wanted:
        yield
        return
    core = sorted(os.sched_getaffinity(0))[BUSY_CORE]
    spinner = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def line_of(row: dict) -> str:
    head = f"{row['algorithm']} {row['balance']} trial {row['trial']}"
    if "failed" in row:
        return f"{head}: failed: {row['failed']}"
    return (f"{head}: {row['seconds_per_epoch']:.2f} s/epoch, ideal {row['ideal']:.2f} ({row['ratio']:.2f}x), "
            f"accuracy {row['accuracy']:.4f}, shares {shares_text(row['shares'])}")


def shares_text(shares: list[float]) -> str:
    return " / ".join(f"{share:.2f}" for share in shares)


def detail_table(rows: list[dict]) -> str:
    lines = ["| algorithm | balance | trial | epoch 1 s | s / epoch | ideal s | epoch / ideal | communication s "
             "| last shares | last rates (rows/s) | accuracy |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    for row in rows:
        head = f"| {row['algorithm']} | {row['balance']} | {row['trial']} |"
        if "failed" in row:
            lines.append(f"{head} failed: {row['failed'].splitlines()[0]} | | | | | | | |")
            continue
        rates = " / ".join(f"{rate:,.0f}" for rate in row["rates"])
        lines.append(f"{head} {row['first_epoch']:.2f} | {row['seconds_per_epoch']:.2f} | {row['ideal']:.2f} | "
                     f"{row['ratio']:.2f}x | {row['communication']:.2f} | {shares_text(row['shares'])} | {rates} | "
                     f"{row['accuracy']:.4f} |")
    return "\n".join(lines)


def summary_table(rows: list[dict], algorithms: list[str]) -> str:
    """Per algorithm and balance: the trials' mean s/epoch and ratio, and their accuracies' range."""
    lines = ["| algorithm | balance | s / epoch | epoch / ideal | accuracy (min - max) |",
             "| --- | --- | ---: | ---: | --- |"]
    for name in algorithms:
        for balance in BALANCES:
            done = [row for row in rows if row["algorithm"] == name and row["balance"] == balance
                    and "failed" not in row]
            if not done:
                lines.append(f"| {name} | {balance} | failed | | |")
                continue
            accuracies = [row["accuracy"] for row in done]
            lines.append(f"| {name} | {balance} | {statistics.mean(row['seconds_per_epoch'] for row in done):.2f} | "
                         f"{statistics.mean(row['ratio'] for row in done):.2f}x | "
                         f"{min(accuracies):.4f} - {max(accuracies):.4f} |")
    return "\n".join(lines)


def never_slower(rows: list[dict], algorithms: list[str]) -> str:
    """The issue's goal per algorithm: speed shares' mean s/epoch no more than NEVER_SLOWER x equal shares'."""
    lines = []
    for name in algorithms:
        means = {}
        for balance in BALANCES:
            done = [row["seconds_per_epoch"] for row in rows if row["algorithm"] == name and row["balance"] == balance
                    and "failed" not in row]
            means[balance] = statistics.mean(done) if done else None
        if not means["equal"] or means["speed"] is None:
            lines.append(f"- {name}: speed / equal not measured")
            continue
        ratio = means["speed"] / means["equal"]
        lines.append(f"- {name}: speed / equal {ratio:.3f}x (limit {NEVER_SLOWER}x): "
                     f"{'met' if ratio <= NEVER_SLOWER else '**missed**'}")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=90_000)
    parser.add_argument("--test-rows", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--rate", default="1gbit", help="the hosts' links (tc tbf syntax)")
    parser.add_argument("--layout", choices=list(LAYOUTS), default="shared",
                        help="shared: 3 hosts, two sharing a core; busy: 2 hosts, the second beside a busy loop")
    parser.add_argument("--algorithms", help="comma-separated, of: " + ", ".join(ALGORITHMS) + " (default: all)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10k rows, 3 epochs, 1 trial, averaging "
                        "unless --algorithms")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.test_rows, args.epochs, args.trials = 10_000, 2_000, 3, 1
        args.algorithms = args.algorithms or "averaging"
    args.algorithms = [name.strip() for name in (args.algorithms or ",".join(ALGORITHMS)).split(",")]
    unknown = [name for name in args.algorithms if name not in ALGORITHMS]
    if unknown:
        parser.error(f"--algorithms: unknown {', '.join(unknown)}; choose from {', '.join(ALGORITHMS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    reason = missing_requirements(2)
    if reason:
        sys.exit(f"benchmarks.uneven: {reason}")
    data = prepare_digits(args.rows, args.test_rows)
    began = time.monotonic()
    rows = run_all(args, data)
    seconds = time.monotonic() - began
    info = machine()
    command = " ".join(["python -m benchmarks.uneven", *(argv if argv is not None else sys.argv[1:])])
    markdown = f"""# Unequal machines: equal and speed shares against the ideal

{machine_line(info)}. The emulated cluster: network namespaces on a bridge, links shaped to {args.rate}
with `tc tbf` (a small bucket), one worker per host with 1 thread. {LAYOUT_TEXT[args.layout]} 784-40-10
sigmoid perceptron, {args.rows:,} synthetic digit rows ({args.test_rows:,} test rows), batch
{args.batch_size}, SGD lr 0.1 momentum 0.5, {args.epochs} epochs, {args.trials} trial(s) each
(trial n: train.seed = n - 1). `{command}` ({seconds / 60:.1f} minutes).

"s / epoch": the mean training seconds of epochs {STEADY_FROM}..{args.epochs} (evaluation excluded);
"ideal": those epochs' rows / the sum of the trainers' measured rates (rows per second of each
one's own compute and data): the epoch if every trainer were busy to its end and nothing else took
time; "communication": the trainers' mean seconds in exchanges and waits, per epoch. Goals: speed
shares within 1.1x of the ideal for every algorithm, accuracy unchanged within the trials' spread, and
speed shares never more than {NEVER_SLOWER}x slower than equal shares:

{never_slower(rows, args.algorithms)}

{summary_table(rows, args.algorithms)}

{detail_table(rows)}
"""
    data_out = {"machine": info, "rows": args.rows, "test_rows": args.test_rows, "epochs": args.epochs,
                "batch_size": args.batch_size, "rate": args.rate, "trials": args.trials, "quick": args.quick,
                "layout": args.layout, "pinning": {key: list(value) for key, value in LAYOUTS[args.layout].items()},
                "results": rows}
    path = write_result("uneven", markdown, data_out)
    print(markdown)
    print(f"written: {path}")
    return 0 if all("failed" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
