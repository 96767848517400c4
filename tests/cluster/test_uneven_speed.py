"""Machines of different speeds on the emulated cluster: speed shares follow the rates the job measured.

Three hosts with one worker each; host0 has a core to itself while host1 and host2 share the other.
With cluster.balance = "speed" and averaging, every epoch's rows add up to the training rows, the
first epoch's are equal, each later epoch trains on the shares the one before announced, and every
announcement is what a Balancer decides from the rates the epochs recorded in their `epoch_end`
events (replayed here from those events): the shares follow the measured rates, whatever those turn
out to be on a loaded machine. How large a share the host with a core to itself then gets, and how
much speed shares shorten the epoch, depend on the machine's load: benchmarks/uneven.py measures
them (each trainer's last share and rate, and speed shares' epoch against equal shares' and the ideal).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shoal.data.balance import proportional
from shoal.events import read_events
from shoal.train.balancer import Balancer
from shoal.train.loop import EpochStats
from tests.cluster.hosts import EmulatedCluster, missing_requirements
from tests.cluster.jobs import PORT, SECRET, wait_for_nodes
from tests.e2e.jobs import write_task

HOSTS = 3
ROWS = 120_000  # an epoch of about a second on a 2-core machine
EPOCHS = 4
BATCH = 64
JOB_SECONDS = 90


@pytest.fixture(scope="module")
def uneven_cluster():
    reason = missing_requirements(2)  # two cores: the third host shares the second one's
    if reason:
        pytest.skip(reason)
    with EmulatedCluster(hosts=HOSTS, rate="1gbit", cores=[0] + [1] * (HOSTS - 1)) as cluster:
        yield cluster


def write_job(folder: Path) -> str:
    train, _ = write_task(folder, rows=ROWS, test_rows=10)
    path = folder / "speed.toml"
    path.write_text(f"""
[model]
layers = [{{ dense = 128, activation = "tanh" }}, {{ dense = 128, activation = "tanh" }}, {{ dense = 2 }}]
[data]
train = "{train}"
[algorithm]
name = "averaging"
[train]
epochs = {EPOCHS}
batch_size = {BATCH}
optimizer = {{ name = "sgd", lr = 0.05 }}
[checkpoint]
every = 0
[cluster]
threads = 1
timeout = 60
balance = "speed"
[output]
progress = "none"
""")
    return str(path)


def train_on_every_host(cluster, job: str, run_dir: Path, env: dict) -> None:
    """One node a host (`--workers 1 --nnodes 3`), started by hand as the README's Many machines section says."""
    launchers, logs = [], []
    for host in range(cluster.hosts):
        command = [sys.executable, "-m", "shoal", "train", job, "--workers", "1", "--nnodes", str(cluster.hosts),
                   "--node-rank", str(host), "--rdzv-endpoint", f"{cluster.address(0)}:{PORT}", "--run-dir",
                   str(run_dir)]
        logs.append(cluster.shared / f"{run_dir.name}-host{host}.log")
        launchers.append(cluster.start(host, command, env={**env, "SHOAL_JOB_SECRET": SECRET}, log=logs[-1]))
    wait_for_nodes(launchers, logs, JOB_SECONDS)


def by_rank(epoch: dict) -> list[dict]:
    return sorted(epoch["workers"], key=lambda worker: worker["rank"])


def replayed_moves(ended: list[dict]) -> list[list[int] | None]:
    """The next shares a Balancer announces after each epoch (None: not moved) when it sees the rates the epochs
    recorded: each worker's figure is its recorded rate's rows over one second of work, so the balancer reads that
    rate exactly. Whether a move is kept turns on the epoch's seconds less the rows it re-read, which the record
    does not hold: that verdict is taken from the record (`taken_back`, as a longer epoch), and a verdict where
    the replay judged no move shows as a different announcement."""
    hosts = [worker["host"] for worker in by_rank(ended[0])]
    balancer = Balancer("speed", ROWS, HOSTS, BATCH, same_steps=False, hosts=hosts)  # averaging: own steps
    announced = []
    for number, epoch in enumerate(ended, start=1):
        seconds = 1.0 if epoch.get("taken_back") else 0.5**number  # kept moves shortened the epoch
        figures = [EpochStats(rows=worker["rate"], compute=1.0, seconds=seconds) for worker in by_rank(epoch)]
        moved = balancer.observe(figures, warm=number > 1)  # a fresh process's first epoch judges no move
        announced.append(list(moved.shares) if moved is not None else None)
    return announced


# 12 s on a 2-core machine beside another test run (its timeout 2 x JOB_SECONDS); every assertion is on the
# shares and rates the events recorded, whatever values the machine produced
@pytest.mark.timeout(2 * JOB_SECONDS)
def test_speed_shares_follow_the_rates_the_epochs_recorded(uneven_cluster, project_env):
    cluster = uneven_cluster
    run_dir = cluster.shared / "run-speed"
    train_on_every_host(cluster, write_job(cluster.shared), run_dir, project_env)

    events = list(read_events(run_dir))
    assert [event["status"] for event in events if event["event"] == "job_end"] == ["completed"]
    ended = [event for event in events if event["event"] == "epoch_end"]
    assert [epoch["epoch"] for epoch in ended] == list(range(1, EPOCHS + 1))
    shares = []
    for epoch in ended:
        workers = by_rank(epoch)
        assert [worker["host"] for worker in workers] == [f"host{host}" for host in range(HOSTS)]
        assert epoch["balance"] == "speed"
        assert all(worker["rate"] > 0 for worker in workers), epoch  # every worker measured its own work
        shares.append([worker["rows"] for worker in workers])
        assert sum(shares[-1]) == ROWS == epoch["samples"], epoch
    assert max(shares[0]) - min(shares[0]) <= 1  # equal until a rate is measured
    rates = [[round(worker["rate"]) for worker in by_rank(epoch)] for epoch in ended]  # for the messages
    announced = [epoch.get("next_shares") for epoch in ended]
    # each epoch trains on the shares the one before announced, or keeps its shares
    for before, after, moved in zip(shares, shares[1:], announced):
        assert after == (moved or before), (shares, announced, rates)
    # a move after the first epoch is exactly the proportion of its recorded rates (whether the rates differ
    # enough to move is the machine's doing)
    first = [worker["rate"] for worker in by_rank(ended[0])]
    assert announced[0] in (None, proportional(ROWS, first)), (shares, announced, rates)
    # and every announcement is the balancer's answer to the recorded rates, so the shares follow the speeds
    # measured, whatever the machine's load made them
    assert replayed_moves(ended) == announced, (shares, announced, rates)
