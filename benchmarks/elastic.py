"""A machine lost and got back: epoch times, accuracy and recovery seconds of `--nnodes 2:3`.

On the emulated cluster (tests/cluster/hosts.py: network namespaces, a tbf-shaped 1 Gbit/s link with a
small bucket; host0 alone on core 0, hosts 1 and 2 sharing core 1, two cores here) each host starts
`shoal train --nnodes 2:3` by hand with one worker and its own /tmp as run directory (no shared folder:
host0 keeps the events and rank 0's checkpoints). cNeural's 784-40-10 perceptron trains synthetic
digits. First an uninterrupted 3-machine job (`--nnodes 3`), then the elastic one: every process of
host2 is SIGKILLed half way through epoch 2, and host2's node is started again once epoch 3 has ended,
so it joins at the end of epoch 4.

Per run: each epoch's seconds and worker count, the final test accuracy, and for the elastic run the
seconds from the kill to training again (the `job_resumed` event of the next attempt, on 2 machines)
and from the join's checkpoint to training again on 3. With `--data served` the dataset lies in
host0's /tmp alone and the others stream their shares from it (shoal.data.flight).

    .venv/bin/python -m benchmarks.elastic           # about 2 minutes on 2 cores
    .venv/bin/python -m benchmarks.elastic --data served
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster.hosts import EmulatedCluster, missing_requirements

from benchmarks.common import ROOT, machine, machine_line, write_result
from shoal.cluster.node.rendezvous import REPORT_SECONDS, SILENT_SECONDS
from shoal.data.synthetic import synth_digits
from shoal.events import Checkpoint, EpochEnd, History, JobResumed, Membership, read_history

PORT = 29470
SECRET = "benchmark-elastic"
RUN_DIR = "/tmp/run"  # each host's own
SECONDS_LIMIT = 600


def write_job(folder: Path, data: Path, args: argparse.Namespace) -> Path:
    path = folder / "elastic.toml"
    path.write_text(f"""[model]
input = [784]
layers = [{{ dense = 40, activation = "sigmoid" }}, {{ dense = 10 }}]
[data]
train = "{data / 'train'}"
test = "{data / 'test'}"
[algorithm]
name = "{args.algorithm}"
[train]
epochs = {args.epochs}
batch_size = {args.batch_size}
optimizer = {{ name = "sgd", lr = 0.1, momentum = 0.5 }}
[cluster]
threads = 1
timeout = 60
rejoin_timeout = {args.rejoin_timeout}
[output]
progress = "lines"
""")
    return path


def start(cluster: EmulatedCluster, host: int, job: Path, nodes: str, name: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
    command = [sys.executable, "-m", "shoal", "train", str(job), "--workers", "1", "--nnodes", nodes,
               "--rdzv-endpoint", f"{cluster.address(0)}:{PORT}", "--rdzv-id", SECRET, "--run-dir",
               f"{RUN_DIR}-{name}"]
    return cluster.start(host, command, env=env, log=cluster.shared / f"{name}-host{host}.log")


def events_of(cluster: EmulatedCluster, name: str) -> History:
    return read_history(cluster.private(0) / f"run-{name}")


def wait_for_epoch(cluster: EmulatedCluster, name: str, epoch: int, after: float = 0.0,
                   seconds: float = SECONDS_LIMIT) -> EpochEnd:
    """The first epoch_end of `epoch` or later written after `after` (time.time())."""
    deadline = time.monotonic() + seconds
    while True:
        started = (cluster.private(0) / f"run-{name}" / "events.jsonl").exists()
        ended = [event for event in events_of(cluster, name).epochs if event.epoch >= epoch and event.time > after] \
            if started else []
        if ended:
            return ended[0]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: epoch {epoch} did not end within {seconds:g} s")
        time.sleep(0.05)


def finish(cluster: EmulatedCluster, launchers: list[subprocess.Popen], name: str) -> None:
    for host, launcher in enumerate(launchers):
        if launcher.wait(timeout=SECONDS_LIMIT) != 0:
            log = (cluster.shared / f"{name}-host{host}.log").read_text()
            raise RuntimeError(f"{name}: host{host} failed: {log[-1500:]}")


def uninterrupted(cluster: EmulatedCluster, job: Path) -> History:
    finish(cluster, [start(cluster, host, job, "3", "fixed") for host in range(3)], "fixed")
    return events_of(cluster, "fixed")


def elastic(cluster: EmulatedCluster, job: Path) -> tuple[History, float, float]:
    """The elastic run; returns its events, the kill's and the restart's times (time.time())."""
    launchers = [start(cluster, host, job, "2:3", "elastic") for host in range(3)]
    first = wait_for_epoch(cluster, "elastic", 1)
    time.sleep(first.seconds / 2)  # half way through epoch 2
    killed = time.time()
    for pid in cluster.pids(2):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launchers[2].wait(timeout=30)
    wait_for_epoch(cluster, "elastic", 3, after=killed)
    restarted = time.time()
    launchers[2] = start(cluster, 2, job, "2:3", "elastic")
    finish(cluster, launchers, "elastic")
    return events_of(cluster, "elastic"), killed, restarted


def summary(history: History, killed: float | None = None) -> dict:
    """Each epoch's seconds and workers (an epoch redone after the loss replaces the one lost), the final
    accuracy and, for the elastic run, the recovery and join seconds and the membership changes."""
    epochs = [{"epoch": event.epoch, "seconds": round(event.seconds, 2), "workers": len(event.workers)}
              for event in history.latest_epochs()]
    end = history.end
    began = history.events[0].time  # wall time: job_end's seconds count its last attempt's training only
    row = {"epochs": epochs, "status": end.status, "accuracy": (end.test or {}).get("accuracy"),
           "job_seconds": round(end.time - began, 1)}
    if killed is not None:
        resumed = history.of(JobResumed)
        row["recovery_seconds"] = round(resumed[0].time - killed, 1)
        row["changes"] = [{"hosts": change.hosts, "left": change.left, "joined": change.joined,
                           "reason": change.reason, "from_epoch": change.from_epoch, "world_size": change.world_size}
                          for change in history.of(Membership)]
        saved = [event for event in history.of(Checkpoint) if event.time < resumed[-1].time]
        row["join_pause_seconds"] = round(resumed[-1].time - saved[-1].time, 1) if len(resumed) > 1 else None
    return row


def epochs_table(fixed: dict, moved: dict) -> str:
    lines = ["| epoch | uninterrupted s (workers) | elastic s (workers) |", "| ---: | ---: | ---: |"]
    for before, after in zip(fixed["epochs"], moved["epochs"]):
        lines.append(f"| {before['epoch']} | {before['seconds']:.2f} ({before['workers']}) | "
                     f"{after['seconds']:.2f} ({after['workers']}) |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--test-rows", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--algorithm", default="sync", choices=["sync", "averaging"])
    parser.add_argument("--rejoin-timeout", type=float, default=5.0)
    parser.add_argument("--data", choices=["shared", "served"], default="shared",
                        help="shared: every host sees the dataset; served: host0 alone holds it, the others stream")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    reason = missing_requirements(2)
    if reason:
        sys.exit(f"benchmarks.elastic: {reason}")
    began = time.monotonic()
    with EmulatedCluster(hosts=3, rate="1gbit", cores=[0, 1, 1]) as cluster:
        data = (cluster.private(0) if args.data == "served" else cluster.shared) / "digits"
        synth_digits(str(data / "train"), args.rows, seed=1)
        synth_digits(str(data / "test"), args.test_rows, seed=2)
        seen = Path("/tmp/digits") if args.data == "served" else data  # as the hosts see it
        job = write_job(cluster.shared, seen, args)
        fixed = summary(uninterrupted(cluster, job))
        events, killed, _ = elastic(cluster, job)
        moved = summary(events, killed)
    seconds = time.monotonic() - began
    info = machine()
    command = " ".join(["python -m benchmarks.elastic", *(argv if argv is not None else sys.argv[1:])])
    changes = "\n".join(f"- attempt from epoch {change['from_epoch']}: {', '.join(change['hosts'])} "
                        f"({change['world_size']} workers): {change['reason']}" for change in moved["changes"])
    markdown = f"""# A machine lost and got back (--nnodes 2:3)

{machine_line(info)}. The emulated cluster: 3 hosts (host0 on core 0, host1 and host2 sharing core 1),
links shaped to 1 Gbit/s with `tc tbf` (a small bucket), one worker per host, 1 thread, each host's own
/tmp as run directory; data {args.data}. `{args.algorithm}`, 784-40-10 sigmoid perceptron, {args.rows:,}
synthetic digit rows ({args.test_rows:,} test rows), batch {args.batch_size}, {args.epochs} epochs,
cluster.rejoin_timeout = {args.rejoin_timeout:g} s. Host2 is SIGKILLed (every process) half way through
epoch 2 and started again after epoch 3. `{command}` ({seconds / 60:.1f} minutes).

| run | final accuracy | job seconds (wall, first event to job_end) |
| --- | ---: | ---: |
| uninterrupted, 3 machines | {fixed['accuracy']:.4f} | {fixed['job_seconds']:.1f} |
| lost in epoch 2, back after epoch 3 | {moved['accuracy']:.4f} | {moved['job_seconds']:.1f} |

Seconds from the kill to training again on 2 machines: **{moved['recovery_seconds']:.1f}** (the peers'
failure, the wait for every node's account of it, at most {REPORT_SECONDS:g} s and {SILENT_SECONDS:g} s more once a
node's launcher stops beating, {args.rejoin_timeout:g} s of cluster.rejoin_timeout for host2 to come back, the new
attempt's start and the resharded resume). Seconds from the checkpoint at which
host2 joined to training again on 3: {moved['join_pause_seconds']}. Host2's launcher starts on the core
host1 trains on, so host1's epochs slow while it starts (epoch 4 here); on machines of their own
they would not.

{epochs_table(fixed, moved)}

Membership:
{changes}
"""
    path = write_result("elastic", markdown, {"machine": info, "arguments": vars(args), "uninterrupted": fixed,
                                              "elastic": moved})
    print(markdown)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
