"""Which failure the leader blames after a failed attempt, from every node's report.

After one worker fails, the others fail too (a lost peer, stopped by their launcher), and a
node may not report at all; `root_cause` must name the one that started it, so the message
and the `worker_failed` event point at the right rank and host.
"""

from __future__ import annotations

from shoal.cluster.node.rendezvous import Report, failure_fields
from shoal.cluster.node.supervisor import root_cause
from shoal.events import WorkerFailed

HOSTS = ["node-a", "node-b", "node-c"]

CAUSE = WorkerFailed(rank=4, host="node-c", exit_code=1, message="ValueError: label 9 out of range")
LOST_PEER = WorkerFailed(rank=0, host="node-a", exit_code=1, message="RuntimeError: Connection reset by peer")
STOPPED = WorkerFailed(rank=2, host="node-b", exit_code=-15, signal="SIGTERM", message="killed by SIGTERM")


def cause(node: int, failure: WorkerFailed = CAUSE) -> Report:
    return Report(node, failure=failure_fields(failure))


def consequence(node: int, failure: WorkerFailed) -> Report:
    return Report(node, failure=failure_fields(failure), consequence=True)


def test_a_silent_worker_wins_over_every_report():
    silent = {"rank": 5, "host": "node-c", "step": 300}
    failure, text = root_cause([consequence(0, LOST_PEER), cause(1)], [2], silent, HOSTS)
    assert failure == WorkerFailed(rank=5, host="node-c", message="stopped answering at step 300")
    assert text == "worker rank 5 on node-c stopped answering at step 300; the others waited for it"


def test_a_worker_hung_past_the_stall_timeout_is_named_with_its_silence():
    silent = {"rank": 1, "host": "node-a", "step": 67, "count": 70, "silent_for": 31.2}
    killed = WorkerFailed(rank=1, host="node-a", exit_code=-9, signal="SIGKILL", message="killed by SIGKILL")
    failure, text = root_cause([cause(0, killed)], [], silent, HOSTS)  # killed by its launcher afterwards
    said = "stopped answering at step 67 (no heartbeat for 31 s)"
    assert failure == WorkerFailed(rank=1, host="node-a", message=said)
    assert text == f"worker rank 1 on node-a {said}; the others waited for it"


def test_a_nodes_own_cause_wins_over_consequences():
    failure, text = root_cause([consequence(0, LOST_PEER), consequence(1, STOPPED), cause(2)], [], None, HOSTS)
    assert failure == CAUSE
    assert text == "worker rank 4 on node-c failed: ValueError: label 9 out of range"


def test_a_nodes_own_cause_wins_over_a_missing_node():
    failure, _ = root_cause([consequence(0, LOST_PEER), cause(2)], [1], None, HOSTS)
    assert failure == CAUSE


def test_with_only_consequences_the_missing_node_is_named():
    failure, text = root_cause([consequence(0, LOST_PEER), consequence(2, STOPPED)], [1], None, HOSTS)
    assert failure == WorkerFailed(host="node-b", message="its launcher stopped answering (gone, or cut off)")
    assert text == "node-b (node 1): its launcher stopped answering (gone, or cut off)"


def test_with_only_consequences_and_none_missing_the_first_failed_is_named():
    reports = [Report(0, succeeded=True), consequence(1, STOPPED), consequence(2, LOST_PEER)]
    failure, text = root_cause(reports, [], None, HOSTS)
    assert failure == STOPPED
    assert text == "worker rank 2 on node-b failed: killed by SIGTERM"


def test_when_nothing_failed_the_workers_are_blamed_together():
    reports = [Report(node, succeeded=True) for node in range(3)]
    assert root_cause(reports, [], None, HOSTS) == (WorkerFailed(message="the workers failed"), "the workers failed")


def test_a_rank_never_heard_is_placed_on_its_host_and_said_to_have_made_no_step():
    silent = {"rank": 3, "host": "?", "step": None}
    failure, text = root_cause([], [], silent, ["node-a", "node-b"], workers=2)
    assert failure == WorkerFailed(rank=3, host="node-b", message="stopped answering before its first step")
    assert text.startswith("worker rank 3 on node-b stopped answering before its first step")
