"""The control plane at 4 to 32 machines: seconds to start, to go on without a lost machine, and to take one back.

The seeds ran 16 nodes (Parallel SGD), 36 machines (cNeural) and 60 workers (mpi_learn). Here an elastic job
(`--nnodes N-1:N`, one worker a host, each host's own /tmp as run directory, as benchmarks/elastic.py starts it)
trains cNeural's 784-40-10 perceptron on the emulated cluster of N hosts, every host at the same dilated speed
(tests/cluster/hosts.py: 1/D of a core and 1/D of a 1 Gbit/s link, D hosts to a core, D = 16 by default so that
32 hosts fit 2 cores; the smaller clusters leave cores idle, so every size has hosts of one speed). Per size:

- start: from starting the N launchers to the job's `job_start` (every worker has met, rendezvous done);
- recovery: from SIGKILLing every process of the last host, half an epoch after the first checkpoint, to training
  again on N-1 (`job_resumed`);
- join: from that host's launcher started again (after the next epoch) to training again on N; and the pause,
  from the checkpoint the others wait at to training again. The job is then stopped (SIGTERM to its launchers).

The job's own waits are dilated with the hosts (cluster.timeout 30 s, rejoin_timeout 5 s and stall_timeout 30 s,
each times D; only the one-second heartbeat stays, so beats are relatively D times more frequent), and times are
reported divided by D: the seconds on the machines a host stands for. Compare sizes with each other (same D). Goal: 32
hosts at most 2x 4 hosts, each. Every host's log and the events are kept in benchmarks/work/control-plane/.

    .venv/bin/python -m benchmarks.control_plane            # about 20 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster.hosts import EmulatedCluster

from benchmarks.common import WORK, machine, machine_line, require_cluster, write_result
from benchmarks.elastic import events_of, start, wait_for_epoch
from shoal.data.synthetic import synth_digits
from shoal.events import Checkpoint, JobResumed, JobStart

GOAL = 2.0
REJOIN_SECONDS = 5
# more than the study needs: the job is stopped once the arrival has trained with the others
EPOCHS = 100_000
KEPT = WORK / "control-plane"


def write_job(folder: Path, data: Path, epochs: int, dilation: int, batch: int) -> Path:
    path = folder / "control.toml"
    path.write_text(f"""[model]
input = [784]
layers = [{{ dense = 40, activation = "sigmoid" }}, {{ dense = 10 }}]
[data]
train = "{data}"
[algorithm]
name = "sync"
[train]
epochs = {epochs}
batch_size = {batch}
optimizer = {{ name = "sgd", lr = 0.1 }}
[checkpoint]
every = 1
[cluster]
threads = 1
timeout = {30 * dilation}
rejoin_timeout = {REJOIN_SECONDS * dilation}
stall_timeout = {30 * dilation}
[output]
progress = "lines"
""")
    return path


def measure(hosts: int, dilation: int, rows_per_host: int) -> dict:
    """Start, recovery and join seconds of one elastic job on `hosts` dilated hosts."""
    with EmulatedCluster(hosts=hosts, rate="1gbit", dilation=dilation) as cluster:
        data = cluster.shared / "digits"
        synth_digits(str(data), rows_per_host * hosts, seed=1)
        # one step an epoch: a dilated ring of 32 waits up to a period (D slices) at each hop, and the control
        # plane, not the steps, is what is measured
        job = write_job(cluster.shared, data, EPOCHS, dilation, rows_per_host)
        try:
            return timings(cluster, job, hosts, dilation)
        finally:
            keep_logs(cluster, KEPT / f"hosts-{hosts}")


def keep_logs(cluster: EmulatedCluster, folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for log in cluster.shared.glob("*.log"):
        shutil.copy2(log, folder / log.name)
    events = cluster.private(0) / "run-elastic" / "events.jsonl"
    if events.exists():
        shutil.copy2(events, folder / "events.jsonl")


def timings(cluster: EmulatedCluster, job: Path, hosts: int, dilation: int) -> dict:
    """Start, recovery and join, in seconds divided by `dilation`; the job is stopped (SIGTERM to every launcher)
    once the arrival has trained an epoch with the others."""
    nodes, last = f"{hosts - 1}:{hosts}", hosts - 1
    began = time.time()
    launchers = [start(cluster, host, job, nodes, "elastic") for host in range(hosts)]
    first = wait_for_epoch(cluster, "elastic", 1, seconds=3600)
    saved = wait_for_event(cluster, Checkpoint, after=0)
    time.sleep(first.seconds / 2)  # half way through the epoch after the first checkpoint
    killed = time.time()
    for pid in cluster.pids(last):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launchers[last].wait(timeout=60)
    resumed_epoch = wait_for_epoch(cluster, "elastic", saved.epoch + 1, after=killed, seconds=3600).epoch
    returned = time.time()
    launchers[last] = start(cluster, last, job, nodes, "elastic")
    joined = wait_for_event(cluster, JobResumed, after=returned)
    wait_for_epoch(cluster, "elastic", 1, after=joined.time, seconds=3600)
    stop(launchers)
    history = events_of(cluster, "elastic")
    started = history.of(JobStart)[0].time
    after_kill = next(event for event in history.of(JobResumed) if event.time > killed)
    saved = [event for event in history.of(Checkpoint) if event.time < joined.time]
    return {"hosts": hosts, "dilation": dilation, "start": round((started - began) / dilation, 2),
            "recovery": round((after_kill.time - killed) / dilation, 2),
            "join": round((joined.time - returned) / dilation, 2),
            "join_pause": round((joined.time - saved[-1].time) / dilation, 2) if saved else None,
            "epoch_seconds": round(first.seconds / dilation, 3), "resumed_epoch": resumed_epoch,
            "started_with": history.of(JobStart)[0].world_size, "joined_with": joined.world_size}


def wait_for_event(cluster: EmulatedCluster, kind: type, after: float, seconds: float = 3600):
    """The first event of `kind` the job wrote after `after` (time.time())."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = [event for event in events_of(cluster, "elastic").of(kind) if event.time > after]
        if found:
            return found[0]
        time.sleep(0.2)
    raise RuntimeError(f"no {kind.__name__} within {seconds:g} s")


def stop(launchers: list) -> None:
    """SIGTERM to every launcher (a stop, as Ctrl-C would), then wait for each."""
    for launcher in launchers:
        launcher.send_signal(signal.SIGTERM)
    for launcher in launchers:
        try:
            launcher.wait(timeout=600)
        except subprocess.TimeoutExpired:
            launcher.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16,32")
    parser.add_argument("--dilation", type=int, default=16)
    parser.add_argument("--rows-per-host", type=int, default=1000)
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    require_cluster("benchmarks.control_plane", max(sizes), args.dilation)
    began = time.monotonic()
    rows = []
    for hosts in sizes:
        rows.append(measure(hosts, args.dilation, args.rows_per_host))
        print(rows[-1], flush=True)
    base = rows[0]
    lines = ["| hosts | met | start s | recovery s | join s | join pause s | epoch s | after the join |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        lines.append(f"| {row['hosts']} | {row['started_with']} | {row['start']} | {row['recovery']} | {row['join']} | "
                     f"{row['join_pause']} | {row['epoch_seconds']} | {row['joined_with']} |")
    verdicts = []
    for what in ("start", "recovery", "join"):
        if base[what] and rows[-1][what] is not None:
            ratio = rows[-1][what] / base[what]
            verdicts.append(f"- {what}: {rows[-1]['hosts']} hosts {ratio:.2f}x {base['hosts']} hosts "
                            f"({'met' if ratio <= GOAL else 'missed'}, goal <= {GOAL:g}x)")
    info = machine()
    markdown = f"""# The control plane at {', '.join(map(str, sizes))} machines

{machine_line(info)}. Emulated hosts dilated by D = {args.dilation} (1/{args.dilation} of a core each, links at
1/{args.dilation} of 1 Gbit/s), one worker a host; `sync`, 784-40-10 perceptron, {args.rows_per_host:,} digit rows
a host, one step an epoch (batch {args.rows_per_host:,}), `--nnodes N-1:N`, the job's waits times D (rejoin timeout
{REJOIN_SECONDS} s x D). The last host is SIGKILLed half an epoch after the first checkpoint and started again
after the next epoch; once it has trained an epoch with the others the job is stopped. Seconds divided by D;
"met" is how many hosts the job started with, "after the join" how many trained after the arrival.
`python -m benchmarks.control_plane --sizes {args.sizes} --dilation {args.dilation}`
({(time.monotonic() - began) / 60:.1f} minutes).

{chr(10).join(lines)}

{chr(10).join(verdicts)}
"""
    path = write_result("control-plane", markdown, {"machine": info, "arguments": vars(args), "results": rows})
    print(markdown)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
