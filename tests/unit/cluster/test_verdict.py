"""One order of precedence names a failed attempt's root cause, whoever launched the workers.

The table is shoal.cluster.verdict's documented order: for each pair of kinds, which one wins,
whichever is given first. Then the three callers (one node's launcher, the leader over every node,
rank 0 under other launchers) are shown to follow it where they used to disagree.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch.distributed as dist

from shoal.cluster import keys
from shoal.cluster.node.rendezvous import Report, failure_fields
from shoal.cluster.node.supervisor import root_cause as leaders_cause
from shoal.cluster.verdict import Account, Kind, root_cause
from shoal.events import WorkerFailed
from shoal.train.exits import Exit, ExitBook, cause

PRECEDENCE = [Kind.SILENT, Kind.RAISED, Kind.KILLED, Kind.FOLLOWED]
PAIRS = [(first, second, min(first, second, key=PRECEDENCE.index))
         for first, second in itertools.permutations(PRECEDENCE, 2)]


@pytest.mark.parametrize(("first", "second", "winner"), PAIRS, ids=[f"{a.name}-{b.name}" for a, b, _ in PAIRS])
def test_each_pair_of_kinds_has_one_winner_whichever_comes_first(first, second, winner):
    accounts = [Account(first, rank=0, host="a"), Account(second, rank=1, host="b")]
    assert root_cause(accounts).kind is winner


def test_the_table_covers_every_kind():
    assert sorted(PRECEDENCE) == list(Kind) and len(PAIRS) == len(Kind) * (len(Kind) - 1)


def test_among_equals_the_first_given_wins_and_nothing_reported_names_nothing():
    accounts = [Account(Kind.FOLLOWED, rank=3), Account(Kind.RAISED, rank=2), Account(Kind.RAISED, rank=1)]
    assert root_cause(accounts).rank == 2
    assert root_cause([]) is None


# ---------------------------------------------------------------- the callers agree


OWN = WorkerFailed(rank=4, host="node-c", exit_code=1, message="ValueError: label 9 out of range")
KILLED = WorkerFailed(rank=0, host="node-a", exit_code=-9, signal="SIGKILL", message="killed by SIGKILL")


def test_under_other_launchers_a_silent_worker_wins_over_an_own_error_as_for_shoals_launcher():
    store = dist.HashStore()
    store.set(keys.SILENT, json.dumps({"rank": 3, "host": "node4", "step": 17}))
    book = ExitBook(store, attempt=0, world_size=4)
    book.write(Exit.of_error(1, "node2", "ValueError: label 9 out of range"))
    exits = book.read()
    failure = cause(book, exits)
    assert (failure.rank, failure.host, failure.message) == (3, "node4", "stopped answering at step 17")
    leaders, _ = leaders_cause([Report(1, failure=failure_fields(OWN))], [], {"rank": 3, "host": "node4", "step": 17},
                               ["node1", "node2", "node3", "node4"])
    assert (leaders.rank, leaders.host) == (failure.rank, failure.host)


def test_the_leader_prefers_a_nodes_raised_error_to_another_nodes_killed_worker_as_one_node_does():
    reports = [Report(0, failure=failure_fields(KILLED)), Report(2, failure=failure_fields(OWN))]
    failure, text = leaders_cause(reports, [], None, ["node-a", "node-b", "node-c"])
    assert failure == OWN and text == "worker rank 4 on node-c failed: ValueError: label 9 out of range"


def test_the_leader_names_a_killed_worker_before_a_node_that_sent_no_report_given_first():
    failure, _ = leaders_cause([Report(0, failure=failure_fields(KILLED))], [1], None, ["node-a", "node-b"])
    assert failure == KILLED


def test_the_leader_places_a_silent_worker_that_never_beat_on_its_machine_by_every_nodes_count():
    # node 0 runs ranks 0-1, node 1 rank 2, node 2 ranks 3-5
    hosts, counts = ["node-a", "node-b", "node-c"], [2, 1, 3]
    for rank, host in ((1, "node-a"), (2, "node-b"), (3, "node-c"), (5, "node-c")):
        failure, _ = leaders_cause([], [], {"rank": rank, "host": "?", "step": 0}, hosts, workers=counts)
        assert (failure.rank, failure.host) == (rank, host)
