"""What the leader of a job of changing machines decides after a failed attempt (`--nnodes MIN:MAX`).

Restarts are counted per machine: a machine whose workers failed restarts with the others while it has
restarts left, and is then left out; a machine that sent no account is left out at once; the first
machine cannot leave (out of restarts, the job stops); a failure no machine can be blamed for is
counted as a fixed job's. The meeting is a stand-in holding the members (no store): the rules are the
supervisor's own.
"""

from __future__ import annotations

from pathlib import Path

from shoal.cluster.node.supervisor import NodeJob, Supervisor
from shoal.config import ClusterConfig
from shoal.events import JobRestarted, WorkerFailed, read_history


class Members:
    """The part of an ElasticMeeting the leader's decision reads: members, hosts, and who was dropped."""

    def __init__(self, hosts: list[str]):
        self.members, self.hosts, self.node_rank = list(range(len(hosts))), hosts, 0
        self.counts = [1] * len(hosts)
        self.dropped: list[int] = []
        self.said = False

    def host_of(self, node: int) -> str:
        return self.hosts[self.members.index(node)]

    def drop(self, nodes: list[int]) -> None:
        self.dropped += nodes

    def leaving(self, node: int) -> str | None:
        """As ElasticMeeting.leaving: host2 was taken out by SIGTERM when `said`."""
        return "left (SIGTERM on its machine)" if node == 2 and self.said else None


def leader(tmp_path: Path, max_restarts: int = 0) -> Supervisor:
    job = NodeJob(tmp_path / "job.toml", tmp_path, ClusterConfig(workers=1, threads=1, timeout=10),
                  max_restarts=max_restarts, elastic=True)
    return Supervisor(job, Members(["host0", "host1", "host2"]), Restarts())


class Restarts:
    """Training's side of the supervisor (shoal.launching's): only a restart's record is asked for here."""

    def restart_record(self, run_dir: Path, number: int) -> JobRestarted:
        return JobRestarted(restart=number)


def failed_on(host: str) -> WorkerFailed:
    """A worker's own error on `host` (one worker a machine: its rank is the host's number)."""
    return WorkerFailed(rank=int(host[-1]), host=host, message="ValueError: bad batch")


def test_a_machine_that_sent_no_account_is_left_out_at_once(tmp_path):
    supervisor = leader(tmp_path, max_restarts=3)
    decision = supervisor.regroup(WorkerFailed(host="host2", message="its launcher stopped answering"), [2], "lost")
    assert decision.restart and decision.regroup and decision.dropped == [2]
    assert supervisor.meeting.dropped == [2]
    assert supervisor.reasons == {"host2": "was lost (its launcher stopped answering)"}


def test_a_machine_that_said_it_leaves_is_recorded_as_left_not_lost(tmp_path):
    supervisor = leader(tmp_path, max_restarts=3)
    supervisor.meeting.said = True
    decision = supervisor.regroup(WorkerFailed(host="host2", message="its launcher stopped answering"), [2], "left")
    assert decision.dropped == [2] and supervisor.reasons == {"host2": "left (SIGTERM on its machine)"}


def test_a_failing_machine_restarts_with_the_others_until_its_restarts_are_spent(tmp_path):
    supervisor = leader(tmp_path, max_restarts=1)
    first = supervisor.regroup(failed_on("host1"), [], "worker rank 1 on host1 failed")
    assert first.restart and not first.regroup and not first.dropped
    assert [event.restart for event in read_history(tmp_path).of(JobRestarted)] == [1]
    other = supervisor.regroup(failed_on("host2"), [], "worker rank 2 on host2 failed")
    assert other.restart and not other.regroup  # restarts are each machine's own
    second = supervisor.regroup(failed_on("host1"), [], "worker rank 1 on host1 failed")
    assert second.regroup and second.dropped == [1]
    assert supervisor.reasons["host1"] == "failed 2 times (--max-restarts 1)"


def test_the_first_machine_out_of_restarts_stops_the_job(tmp_path):
    supervisor = leader(tmp_path, max_restarts=0)
    decision = supervisor.regroup(failed_on("host0"), [], "worker rank 0 on host0 failed")
    assert not decision.restart and not decision.regroup
    assert read_history(tmp_path).end.status == "failed"


def test_a_failure_no_machine_is_blamed_for_is_counted_as_a_fixed_jobs(tmp_path):
    supervisor = leader(tmp_path)
    assert supervisor.regroup(WorkerFailed(message="the workers failed"), [], "the workers failed") is None


def test_a_fixed_job_never_regroups(tmp_path):
    supervisor = leader(tmp_path)
    supervisor.job.elastic = False
    assert supervisor.regroup(WorkerFailed(host="host2", message="gone"), [2], "lost") is None


def test_machines_of_one_name_are_told_apart_by_rank(tmp_path):
    supervisor = leader(tmp_path, max_restarts=0)
    supervisor.meeting.hosts = ["box", "box", "box"]  # two launchers on one machine, as in tests
    lost = supervisor.regroup(WorkerFailed(host="box", message="its launcher stopped answering"), [1], "lost")
    assert lost.regroup and lost.dropped == [1]  # not the first machine, though it has the same name
    assert supervisor.regroup(WorkerFailed(host="box", message="?"), [], "?") is None  # no rank: nobody to blame
    spent = supervisor.regroup(WorkerFailed(rank=2, host="box", message="ValueError"), [], "rank 2 failed")
    assert spent.dropped == [2]
