"""Synchronous SGD's exchange on two emulated hosts at 1 Gbit/s: what compression and hierarchy save on the link.

A model of about a million parameters sends 4 MB of gradients a step, more than the link carries
while the step computes. PowerSGD sends a few kilobytes instead: under a tenth of exact sync's bytes
leave host0 (its interface's count). What that saves in time depends on the machine's load as much as
on the link, so no time is compared here: the speed goals live in benchmarks/comm.py. With two
workers on each host, the hierarchical exchange sums within the host first, so the link carries one
exchange per host: fewer bytes leave a host than with every worker in one flat ring.
"""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path

import pytest
import torch

from shoal.events import read_history
from shoal.run.artifacts import load_model
from tests.cluster.jobs import JOB_SECONDS, start_on_two_hosts
from tests.distributed.common import write_dataset

pytestmark = pytest.mark.timeout(4 * JOB_SECONDS)


def write_job(folder: Path, name: str, options: str) -> str:
    train = folder / "wide-train"
    if not train.exists():
        write_dataset(train, rows=1200, seed=1)
    path = folder / f"{name}.toml"
    path.write_text(f"""
[model]
input = [6]
layers = [{{ dense = 1024, activation = "relu" }}, {{ dense = 1024, activation = "relu" }}, {{ dense = 3 }}]
[data]
train = "{train}"
[algorithm]
name = "sync"
{options}
[train]
epochs = 2
batch_size = 32
optimizer = {{ name = "sgd", lr = 0.02 }}
[cluster]
threads = 1
timeout = 60
[checkpoint]
every = 0
[output]
progress = "none"
""")
    return str(path)


def sent_bytes(cluster, host: int) -> int:
    return int(cluster.run(host, ["cat", "/sys/class/net/eth0/statistics/tx_bytes"]).strip())


def train(cluster, job: str, run_dir: Path, env, workers: int = 1) -> int:
    """The job on both hosts, `workers` each; the bytes host 0 sent meanwhile."""
    before = sent_bytes(cluster, 0)
    launchers = start_on_two_hosts(cluster, job, run_dir, env, workers=workers)
    logs = [cluster.shared / f"{run_dir.name}-host{host}.log" for host in range(2)]
    deadline = time.monotonic() + JOB_SECONDS
    for launcher, log in zip(launchers, logs, strict=True):
        try:
            launcher.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            pytest.fail(f"{log.name} still runs after {JOB_SECONDS} s:\n{log.read_text()[-3000:]}")
        assert launcher.returncode == 0, log.read_text()[-3000:]
    return sent_bytes(cluster, 0) - before


def last_epoch(run_dir: Path):
    return read_history(run_dir).epochs[-1]


def test_powersgd_spends_a_small_part_of_exact_syncs_communication(two_hosts, project_env):
    runs = {}
    for name in ("none", "powersgd"):
        run_dir = two_hosts.shared / f"run-{name}"
        job = write_job(two_hosts.shared, name, f'compression = "{name}"')
        runs[name] = (train(two_hosts, job, run_dir, project_env), last_epoch(run_dir))
    exact, compressed = runs["none"][1], runs["powersgd"][1]
    assert exact.algorithm["compression"] == "none" and compressed.algorithm["compression"] == "powersgd"
    # each epoch's end compares a digest of every replica's weights: the two processes held the same bytes
    epochs = read_history(two_hosts.shared / "run-powersgd").epochs
    assert all("resynchronized" not in epoch.algorithm for epoch in epochs)
    # the waits are recorded (their size is benchmarks/comm.py's): a sum of perf_counter intervals, never negative
    # however loaded the machine, and finite unless the record is broken
    for epoch in (exact, compressed):
        assert math.isfinite(epoch.seconds_split.communication) and epoch.seconds_split.communication >= 0
    assert runs["powersgd"][0] < 0.1 * runs["none"][0]  # bytes on the wire
    assert compressed.train_loss < 1.2  # it trains (3 classes: chance is ln 3 = 1.1 at the start)


def test_the_hierarchical_exchange_sends_fewer_bytes_across_hosts(two_hosts, project_env):
    sent, models = {}, {}
    for hierarchical in ("true", "false"):
        run_dir = two_hosts.shared / f"run-hierarchical-{hierarchical}"
        job = write_job(two_hosts.shared, f"hierarchical-{hierarchical}", f"hierarchical = {hierarchical}")
        sent[hierarchical] = train(two_hosts, job, run_dir, project_env, workers=2)
        models[hierarchical] = load_model(run_dir).state_dict()
    assert sent["true"] < 0.8 * sent["false"], sent
    for name, tensor in models["true"].items():  # the same sums, added in another order
        torch.testing.assert_close(tensor, models["false"][name], rtol=1e-4, atol=1e-5)
