"""How launchers meet: real Meetings on loopback, each in a thread of this process, no workers.

Two Meetings on one machine stand for two machines' launchers: they share the job's store on
127.0.0.1, agree on node ranks and hosts, join each attempt, exchange reports and the leader's
decision, and leave together when one ends the job. Every wait has a short timeout.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor

import psutil
import pytest
import torch.distributed as dist

from shoal.cluster import keys
from shoal.cluster.node.rendezvous import Decision, Meeting, Nodes, Report, read_secret
from shoal.cluster.node.supervisor import NodeJob, data_port, supervise
from shoal.config import ClusterConfig
from shoal.errors import ConfigError, WorkerError
from shoal.events import read_events

HOST = socket.gethostname()
TIMEOUT = 10.0  # cluster.timeout for these meetings: far above what joining on loopback takes
WAIT = 30.0  # the most a test waits for a thread

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


SECRET = "0123456789abcdef0123456789abcdef"


class Layout:
    """Training's side of the supervisor (shoal.launching's), of which only the layout's check is asked here."""

    def __init__(self, check):
        self.check_layout = check


def two_nodes(port: int, rank: int | None = None, run_id: str | None = None) -> Nodes:
    return Nodes(count=2, rank=rank, endpoint=f"127.0.0.1:{port}", run_id=run_id, secret=None if run_id else SECRET)


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as executor:
        yield executor


@pytest.fixture
def meet(pool):
    """Start a Meeting in a thread; every one that opened is closed after the test."""
    opened: list[Meeting] = []

    def start(nodes: Nodes, timeout: float = TIMEOUT) -> Future:
        future = pool.submit(Meeting, nodes, timeout)
        future.add_done_callback(lambda done: done.exception() or opened.append(done.result()))
        return future

    yield start
    for meeting in opened:
        meeting.close()


@pytest.fixture
def pair(meet):
    """Two nodes that met, given node ranks 0 and 1: (leader, follower)."""

    def start(timeout: float = TIMEOUT) -> tuple[Meeting, Meeting]:
        port = free_port()
        leader, follower = meet(two_nodes(port, 0), timeout), meet(two_nodes(port, 1), timeout)
        return leader.result(WAIT), follower.result(WAIT)

    return start


def listening(port: int) -> list[str]:
    return [entry.laddr.ip for entry in psutil.Process().net_connections(kind="tcp")
            if entry.status == psutil.CONN_LISTEN and entry.laddr.port == port]


# ---------------------------------------------------------------- joining


def test_a_single_machine_is_its_own_leader(meet):
    meeting = meet(Nodes()).result(WAIT)
    assert meeting.leader and meeting.node_rank == 0
    assert meeting.hosts == [HOST]


def test_a_single_machine_holds_its_store_on_loopback_only(meet):
    meeting = meet(Nodes()).result(WAIT)
    assert listening(meeting.port) == ["127.0.0.1"]


def test_nodes_given_their_ranks_agree_on_the_hosts(pair):
    leader, follower = pair()
    assert (leader.node_rank, follower.node_rank) == (0, 1)
    assert leader.leader and not follower.leader
    assert leader.hosts == follower.hosts == [HOST, HOST]


def test_without_node_ranks_the_node_that_binds_becomes_node_0(meet):
    port = free_port()
    first, second = meet(two_nodes(port)), meet(two_nodes(port))
    meetings = sorted([first.result(WAIT), second.result(WAIT)], key=lambda meeting: meeting.node_rank)
    assert [meeting.node_rank for meeting in meetings] == [0, 1]
    assert meetings[0].bind is not None and meetings[1].bind is None  # the other's bind found the port taken


def test_a_follower_of_another_job_is_a_config_error(meet):
    port = free_port()
    leader = meet(two_nodes(port, 0, run_id="ours"), timeout=3)
    # the id is the job's secret: a follower with another one does not even see the job's keys
    with pytest.raises(ConfigError, match=rf"--rdzv-endpoint: 127\.0\.0\.1:{port} holds a shoal job with another "):
        Meeting(two_nodes(port, 1, run_id="theirs"), TIMEOUT)
    with pytest.raises(WorkerError, match="1 of 2 machines joined"):  # its follower never came
        leader.result(WAIT)


def test_node_0_for_an_endpoint_of_another_machine_is_a_config_error():
    # 10.255.255.1 is only resolved and compared with this machine's addresses, never contacted
    nodes = Nodes(count=2, rank=0, endpoint="10.255.255.1:29400", secret=SECRET)
    with pytest.raises(ConfigError, match=r"--rdzv-endpoint: 10\.255\.255\.1 is not an address of this machine"):
        Meeting(nodes, timeout=2)


# ---------------------------------------------------------------- attempts


def test_every_node_gets_the_same_store_for_an_attempt(pair, pool):
    leader, follower = pair()
    started = [pool.submit(leader.begin, 0), pool.submit(follower.begin, 0)]
    addresses = [future.result(WAIT) for future in started]
    assert addresses[0] == addresses[1]
    assert addresses[0][0] == "127.0.0.1" and addresses[0][1] == leader.worker_store.port


def test_a_node_that_does_not_join_an_attempt_is_named(pair):
    leader, _ = pair(timeout=2)
    started = time.monotonic()
    with pytest.raises(WorkerError, match=rf"^{HOST} \(node 1\) did not come back within 2 s \(cluster.timeout\)$"):
        leader.begin(0)
    assert time.monotonic() - started < 10


def test_reports_reach_the_leader(pair):
    leader, follower = pair()
    failure = {"rank": 3, "host": HOST, "exit_code": 1, "signal": None, "message": "ValueError: bad row"}
    leader.report(0, Report(0, succeeded=True))
    follower.report(0, Report(1, failure=failure, usage=True))
    assert leader.reports(0, seconds=2) == ([Report(0, succeeded=True), Report(1, failure=failure, usage=True)], [])


def test_a_node_that_sent_no_report_is_missing(pair):
    leader, _ = pair()
    leader.report(0, Report(0, consequence=True, failure={"rank": 0, "message": "lost peer"}))
    reports, missing = leader.reports(0, seconds=0.5)
    assert [report.node for report in reports] == [0]
    assert missing == [1]


def test_a_failed_report_flags_the_attempt(pair):
    leader, follower = pair()
    follower.report(0, Report(1, failure={"message": "KeyError: 'x'"}))
    assert leader.store.get("attempt/0/failed") == b"1"


def test_the_leaders_decision_reaches_a_follower(pair):
    leader, follower = pair()
    decision = Decision(restart=False, message="worker rank 1 failed", failure={"rank": 1}, usage=True)
    leader.decide(0, decision)
    assert follower.decision(0) == decision


# ---------------------------------------------------------------- the job's end


def test_an_end_stops_another_nodes_wait(pair, pool):
    leader, follower = pair()
    waiting = pool.submit(follower.decision, 0)  # would wait 25 s for a decision
    leader.end(f"stopped by SIGINT on {HOST}")
    with pytest.raises(WorkerError, match=rf"^stopped by SIGINT on {HOST}$"):
        waiting.result(WAIT)


def test_the_first_end_is_kept(pair):
    leader, follower = pair()
    follower.end("first")
    leader.end("second")
    assert leader.ended() == follower.ended() == "first"


def test_the_leader_keeps_its_store_until_a_follower_has_read_the_decision(pair, pool):
    leader, follower = pair()
    for joined in [pool.submit(meeting.begin, 0) for meeting in (leader, follower)]:
        joined.result(WAIT)
    decision = Decision(restart=False, message="worker rank 1 on host1 failed: killed by SIGKILL")
    leader.decide(0, decision)
    closing = pool.submit(lambda: (leader.linger(), leader.close()))  # as the leader's launcher leaves
    time.sleep(0.5)  # the follower is slow to look
    assert not closing.done()
    assert follower.decision(0) == decision
    follower.leave()
    closing.result(WAIT)


def test_the_leader_does_not_wait_for_a_follower_that_never_came_back(pair):
    leader, follower = pair(timeout=1)
    with pytest.raises(WorkerError, match="did not come back"):
        leader.begin(0)  # the follower never joins attempt 0
    began = time.monotonic()
    leader.linger()
    assert time.monotonic() - began < 1


# ---------------------------------------------------------------- loopback, the job's secret, worker counts


def test_an_endpoint_named_localhost_keeps_both_stores_on_loopback(meet, pool):
    port = free_port()
    leader, follower = (meet(Nodes(count=2, rank=rank, endpoint=f"localhost:{port}", secret=SECRET)) for rank in (0, 1))
    leader, follower = leader.result(WAIT), follower.result(WAIT)
    started = [pool.submit(leader.begin, 0), pool.submit(follower.begin, 0)]
    worker_port = started[0].result(WAIT)[1]
    started[1].result(WAIT)
    for listened in (listening(port), listening(worker_port)):  # the job's store, the attempt's store
        assert listened and all(ipaddress.ip_address(address).is_loopback for address in listened)


def test_only_this_machines_own_name_opens_a_loopback_endpoint_to_the_network(monkeypatch):
    """localhost stays on loopback; the machine's own name, mapped to 127.0.1.1 as on a stock Debian box, is
    how the other machines reach it, so its stores listen on every address."""
    from shoal.cluster.node import rendezvous
    monkeypatch.setattr(rendezvous, "resolve", lambda host: "127.0.1.1" if host.startswith("node0") else "127.0.0.1")
    monkeypatch.setattr(rendezvous.socket, "gethostname", lambda: "node0")
    monkeypatch.setattr(rendezvous.socket, "getfqdn", lambda: "node0.rack.example")
    assert rendezvous.bind_address("localhost", given=True) == "127.0.0.1"
    assert rendezvous.bind_address("127.0.0.1", given=True) == "127.0.0.1"
    assert rendezvous.bind_address("node0", given=True) == "0.0.0.0"
    assert rendezvous.bind_address("node0.rack.example", given=True) == "0.0.0.0"
    assert rendezvous.bind_address("node0", given=False) == "127.0.0.1"


def test_a_stranger_on_the_port_cannot_end_the_job(meet):
    meeting = meet(Nodes()).result(WAIT)
    stranger = dist.TCPStore("127.0.0.1", meeting.port, is_master=False, wait_for_workers=False)
    for key in ("end", "attempt/0/failed", "attempt/0/decision"):
        stranger.set(key, "stopped by a stranger")
    assert meeting.ended() is None and not meeting.store.check(["attempt/0/failed"])
    assert not any(meeting.secret in key for key in stranger.list_keys())  # listing the keys shows no secret
    meeting.end("stopped by its own")
    assert meeting.ended() == "stopped by its own"


def test_nodes_holding_different_secrets_do_not_meet(meet):
    port = free_port()
    meet(Nodes(count=2, rank=0, endpoint=f"127.0.0.1:{port}", secret="a" * 32), timeout=3)
    with pytest.raises(ConfigError, match=r"--rdzv-endpoint: .* holds a shoal job with another secret"):
        Meeting(Nodes(count=2, rank=1, endpoint=f"127.0.0.1:{port}", secret="b" * 32), TIMEOUT)


def test_every_node_reads_every_nodes_worker_count_once_all_have_joined(pool):
    port = free_port()
    counts = {0: 2, 1: 1, 2: 3}
    early = [pool.submit(Meeting, Nodes(count=3, rank=rank, endpoint=f"127.0.0.1:{port}", secret=SECRET), TIMEOUT,
                         counts[rank]) for rank in (0, 2)]
    time.sleep(0.5)  # node 1 joins after the others wait: its count is read all the same
    late = pool.submit(Meeting, Nodes(count=3, rank=1, endpoint=f"127.0.0.1:{port}", secret=SECRET), TIMEOUT, counts[1])
    meetings = [future.result(WAIT) for future in (early[0], late, early[1])]
    try:
        for meeting in meetings:
            assert meeting.counts == [2, 1, 3]
            assert meeting.layout() == f"node 0 ({HOST}) 2, node 1 ({HOST}) 1, node 2 ({HOST}) 3"
    finally:
        for meeting in meetings:
            meeting.close()


def test_a_layout_the_job_cannot_use_stops_every_node_at_once_naming_the_machines(pool, tmp_path):
    totals = []

    def check(world_size: int) -> None:
        totals.append(world_size)
        raise ConfigError(f"cluster.workers: this algorithm needs 4 processes or more, got {world_size}")

    def node(rank: int, workers: int) -> None:
        job = NodeJob(tmp_path / "job.toml", tmp_path, ClusterConfig(workers=workers, threads=1, timeout=TIMEOUT))
        supervise(job, two_nodes(port, rank), Layout(check))

    port = free_port()
    started = [pool.submit(node, rank, workers) for rank, workers in ((0, 2), (1, 1))]
    for future in started:
        with pytest.raises(ConfigError) as caught:
            future.result(WAIT)  # never waits for the other node
        assert str(caught.value) == ("cluster.workers: this algorithm needs 4 processes or more, got 3 (workers on "
                                     f"each machine: node 0 ({HOST}) 2, node 1 ({HOST}) 1)")
    assert totals == [3, 3]
    assert [event["status"] for event in read_events(tmp_path) if event["event"] == "job_end"] == ["failed"]


def test_one_machines_layout_is_checked_with_its_own_count_and_told_as_it_is(tmp_path):
    def check(world_size: int) -> None:
        raise ConfigError(f"data.train: fewer rows than the {world_size} training workers")

    job = NodeJob(tmp_path / "job.toml", tmp_path, ClusterConfig(workers=3, threads=1, timeout=TIMEOUT))
    with pytest.raises(ConfigError, match=r"^data.train: fewer rows than the 3 training workers$"):
        supervise(job, Nodes(), Layout(check))


def test_a_secret_file_others_may_read_is_refused(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef\n")
    secret.chmod(0o644)
    with pytest.raises(ConfigError, match=r"--secret-file: .* may be read by others \(mode 644\); chmod 600"):
        read_secret(secret)
    secret.chmod(0o600)
    assert read_secret(secret) == "0123456789abcdef"


def test_a_data_server_port_a_stranger_wrote_is_an_error_at_once_never_an_address(pair):
    leader, follower = pair()
    leader.store.set(keys.DATA_PORT, "45678")
    assert data_port(follower, 1.0, "/data/train") == "45678"
    stranger = dist.TCPStore("127.0.0.1", leader.port, is_master=False, wait_for_workers=False)
    stranger.set(leader.store.name(keys.DATA_PORT), "40000")  # its own server's port
    with pytest.raises(WorkerError, match=r"^/data/train: not on this machine .*a data server port that the job's "
                                          r"secret did not make"):
        data_port(follower, 3600.0, "/data/train")  # at once: waiting out the hour would fail the test's timeout
