"""Machines that leave and join (`--nnodes MIN:MAX`): real ElasticMeetings on loopback, in threads, no workers.

Each ElasticMeeting stands for one machine's launcher; the leader (node 0) holds the job's store. The
tests drive attempts by hand: who is a member of each, how a lost machine is waited for and then left
out, how an arrival during an attempt is counted and joins the next one, and the refusals.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch.distributed as dist

from shoal.cluster import keys
from shoal.cluster.node.membership import ElasticMeeting, LeftJob
from shoal.cluster.node.rendezvous import Nodes
from shoal.config import node_range
from shoal.errors import ConfigError, WorkerError

TIMEOUT = 10.0
WAIT = 30.0

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def nodes(port: int, minimum: int, maximum: int) -> Nodes:
    return Nodes(count=maximum, minimum=minimum, endpoint=f"127.0.0.1:{port}", run_id="elastic")


@pytest.fixture
def pool():
    with ThreadPoolExecutor(6) as executor:
        yield executor


@pytest.fixture
def opened():
    meetings: list[ElasticMeeting] = []
    yield meetings
    for meeting in meetings:
        meeting.close()


def meet(port: int, minimum: int, maximum: int, opened: list, rejoin: float = 0.5, workers: int = 1):
    meeting = ElasticMeeting(nodes(port, minimum, maximum), TIMEOUT, workers, rejoin_timeout=rejoin)
    opened.append(meeting)
    return meeting


def follow_into_first_attempt(pool, leader: ElasticMeeting, port: int, maximum: int, opened: list,
                              rejoin: float = 0.5) -> ElasticMeeting:
    """A second machine meets the leader and both begin attempt 0; returns the follower."""
    follower = meet(port, 1, maximum, opened, rejoin)  # met (greeted and claimed) before the leader's wait starts
    first = pool.submit(leader.begin, 0)
    follower.begin(0)
    first.result(WAIT)
    return follower


def test_node_ranges_parse_as_torchrun_writes_them():
    assert node_range("2:3", "--nnodes") == (2, 3)
    assert node_range(4, "cluster.nodes") == (4, 4)
    assert Nodes(count=3, minimum=2).elastic and not Nodes(count=3, minimum=3).elastic and not Nodes(count=3).elastic
    for bad in ("3:2", "0", "0:2", "a", "1:2:3", True, 2.5):
        with pytest.raises(ConfigError, match="--nnodes"):
            node_range(bad, "--nnodes")


def test_the_first_attempt_takes_every_machine_that_came_up_to_max(pool, opened):
    port = free_port()
    leader = meet(port, 1, 3, opened, rejoin=5.0)
    followers = [pool.submit(meet, port, 1, 3, opened, 5.0, workers) for workers in (2, 1)]
    followers = [future.result(WAIT) for future in followers]
    began = [pool.submit(meeting.begin, 0) for meeting in (leader, *followers)]
    for future in began:
        future.result(WAIT)
    assert leader.members == [0, 1, 2] and sorted(followers[0].counts) == [1, 1, 2]
    assert all(meeting.members == leader.members and meeting.hosts == leader.hosts for meeting in followers)
    positions = sorted(meeting.position for meeting in (leader, *followers))
    assert positions == [0, 1, 2] and leader.position == 0


def test_with_fewer_than_max_the_leader_starts_after_rejoin_timeout_once_min_are_there(opened):
    leader = meet(free_port(), 1, 2, opened, rejoin=0.5)
    began = time.monotonic()
    leader.begin(0)
    assert leader.members == [0] and 0.5 <= time.monotonic() - began < 5


def test_an_arrival_is_counted_and_joins_the_next_attempt(pool, opened):
    port = free_port()
    leader = meet(port, 1, 2, opened, rejoin=0.3)
    leader.begin(0)
    assert leader.store.get(keys.CURRENT) == b"0"
    arrival = meet(port, 1, 2, opened)
    assert arrival.first_attempt() == 1
    joining = pool.submit(arrival.begin, 1)
    deadline = time.monotonic() + WAIT
    while not leader.arrivals(1):  # what the leader's watch sees while attempt 0 runs
        assert time.monotonic() < deadline
        time.sleep(0.05)
    leader.begin(1)
    joining.result(WAIT)
    assert leader.members == arrival.members == [0, 1] and leader.previous == {0: socket.gethostname()}
    assert leader.changes() == ([], [socket.gethostname()])
    assert arrival.position == 1


def test_a_lost_machine_is_waited_for_then_left_out(pool, opened):
    port = free_port()
    leader = meet(port, 1, 2, opened, rejoin=0.5)
    follow_into_first_attempt(pool, leader, port, 2, opened, 0.5)
    assert leader.members == [0, 1]
    leader.drop([1])  # it sent no report: gone
    began = time.monotonic()
    leader.begin(1)
    assert leader.members == [0] and time.monotonic() - began >= 0.5
    assert leader.counts == [1] and leader.changes() == ([socket.gethostname()], [])


def test_fewer_than_min_after_the_wait_fails_naming_the_option(pool, opened):
    port = free_port()
    leader = ElasticMeeting(nodes(port, 2, 3), 1.0, 1, rejoin_timeout=0.5)
    opened.append(leader)
    with pytest.raises(WorkerError, match=r"1 of at least 2 machines .*--nnodes 2:3"):
        leader.begin(0)


def test_a_machine_left_out_after_it_was_a_member_says_so(pool, opened):
    port = free_port()
    leader = meet(port, 1, 2, opened, rejoin=0.3)
    follower = follow_into_first_attempt(pool, leader, port, 2, opened, 0.3)
    leader.drop([1])  # out of restarts
    again = pool.submit(follower.begin, 1)
    leader.begin(1)
    with pytest.raises(WorkerError, match="left out"):
        again.result(WAIT)


def test_an_arrival_the_job_cannot_take_is_left_waiting_and_the_others_go_on(pool, opened, capsys):
    port = free_port()

    def layout(world_size: int) -> None:
        if world_size > 2:
            raise ConfigError(f"cluster.groups: 2 groups need an even number of workers, not {world_size}")

    leader = ElasticMeeting(nodes(port, 1, 3), TIMEOUT, 1, rejoin_timeout=0.3, layout=layout)
    opened.append(leader)
    follower = follow_into_first_attempt(pool, leader, port, 3, opened, 0.3)
    assert leader.members == [0, 1]  # a third would not fit
    arrival = meet(port, 1, 3, opened)
    joining = pool.submit(arrival.begin, arrival.first_attempt())
    deadline = time.monotonic() + WAIT
    while not leader.arrivals(1):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    again = pool.submit(follower.begin, 1)
    leader.begin(1)
    again.result(WAIT)
    assert leader.members == [0, 1] and not leader.arrivals(2)  # let go: no regroup for it again
    assert "node 2 cannot join: with it, cluster.groups" in capsys.readouterr().err
    with pytest.raises(LeftJob, match="cannot join the job: with it, cluster.groups") as refused:
        joining.result(WAIT)  # told, in one line, exit status 2
    assert refused.value.exit_code == 2


def test_a_full_job_does_not_stop_for_machines_beyond_max(pool, opened):
    port = free_port()
    leader = meet(port, 1, 2, opened)
    follow_into_first_attempt(pool, leader, port, 2, opened)
    assert leader.members == [0, 1]  # full
    spare = meet(port, 1, 2, opened)
    pool.submit(spare.begin, spare.first_attempt())
    time.sleep(0.5)
    assert not leader.arrivals(1)


def test_a_joined_key_the_job_s_secret_did_not_seal_counts_no_member(pool, opened):
    """A stranger that found where node 1 would say it joined (more than it can: the name needs the secret) and
    wrote there is not taken for a machine: the leader goes on alone."""
    port = free_port()
    leader = meet(port, 1, 2, opened, rejoin=0.3)
    stranger = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    stranger.add(leader.store.name(keys.NEXT_NODE), 1)  # an arrival number: counters carry no seal
    stranger.set(leader.store.name(keys.joined(0, 1)), "1")
    stranger.set(leader.store.name(keys.node(1, "host")), "stranger")
    stranger.set(leader.store.name(keys.node(1, "workers")), "1")
    leader.begin(0)
    assert leader.members == [0] and leader.hosts == [socket.gethostname()]
