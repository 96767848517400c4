"""One node's launcher from start to end: meet the other machines, run attempts, restart together.

Every node runs a supervisor. All of them join the job's store (shoal.cluster.node.rendezvous), check
the job against its world size (every machine's worker count summed, known only then), run
numbered attempts of their workers, and after a failure follow the first node's decision:
restart every node's workers from the newest checkpoint, or stop. The first node (the leader,
whose run directory holds the events) finds the root cause among every node's reports and the
workers' liveness, and records each failure, restart and the job's end, whatever happened.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from shoal.cluster import heartbeat, verdict
from shoal.cluster.node.agent import node_of_rank
from shoal.cluster.node.forkserver import ForkServer
from shoal.cluster.node.launch import launch, restart_line, workers_environment
from shoal.cluster.node.rendezvous import AttemptRendezvous, Decision, Meeting, Nodes, Report, failure_fields
from shoal.cluster.node.watch import AttemptWatch
from shoal.cluster.signals import Interrupted, interruptible
from shoal.cluster.store import SECRET_VARIABLE, StoreUnreachable
from shoal.cluster.verdict import Account, Kind
from shoal.errors import EXIT_USAGE, ConfigError, WorkerError, first_line
from shoal.events import JobEnd, JobRestarted, WorkerFailed, append_event


@dataclass
class Plan:
    """What every attempt on this node runs."""

    job_file: Path
    run_dir: Path
    workers: int
    threads: int
    timeout: float
    restart_record: Callable[[Path, int], JobRestarted]
    """Restart number n of the run directory, from its newest checkpoint (training's shoal.train.exits)."""
    max_restarts: int = 0
    resume: bool = False
    callbacks: Path | None = None
    """The caller's callbacks, written by value (`shoal.fit(callbacks=...)`), for the coordinator."""
    server: ForkServer | None = None
    """The caller's fork server (shoal.cluster.node.forkserver), which every attempt's workers fork from."""
    check_layout: Callable[[int], None] | None = None
    """Training's checks for a job of this many workers in all (training's check_world_size, and a resume's
    checkpoints), raising ConfigError: across machines the total is known only once all have met."""


def supervise(plan: Plan, nodes: Nodes) -> None:
    """Run the job's workers on this node until the job completes; raise WorkerError or Interrupted."""
    meeting = None
    with interruptible():
        try:
            meeting = Meeting(nodes, plan.timeout, plan.workers)
            check_layout(plan, meeting)
            Supervisor(plan, meeting).run()
        except Interrupted as interrupt:
            if meeting is not None:
                meeting.end(f"stopped by {interrupt.signal.name} on {meeting.host}")
            if records_events(meeting, nodes):
                append_event(plan.run_dir, JobEnd(status="interrupted", message=str(interrupt)))
            raise
        except Exception as error:  # whatever it was, the other machines must not wait for this one
            if isinstance(error, (dist.DistError, StoreUnreachable)):
                error = lost_store(first_line(error), meeting)
            if meeting is not None:
                meeting.end(str(error))
                if meeting.leader and not isinstance(error, WorkerError):  # a WorkerError's end is recorded
                    append_event(plan.run_dir, JobEnd(status="failed", message=first_line(error)))
            raise error from None
        finally:
            if meeting is not None:
                meeting.linger() if meeting.leader else meeting.leave()
                meeting.close()


def check_layout(plan: Plan, meeting: Meeting) -> None:
    """Every node checks the job's world size itself once the counts are known (each finds the same), so a
    layout that cannot work stops every machine at once, in one line naming them."""
    if plan.check_layout is None:
        return
    try:
        plan.check_layout(sum(meeting.counts))
    except ConfigError as error:
        if meeting.count == 1:
            raise
        raise ConfigError(f"{first_line(error)} (workers on each machine: {meeting.layout()})") from None


def records_events(meeting: Meeting | None, nodes: Nodes) -> bool:
    """Whether this node writes the job's events: the leader, or node 0 before the machines met."""
    return meeting.leader if meeting is not None else nodes.count == 1 or nodes.rank == 0


def lost_store(reason: str, meeting: Meeting | None) -> WorkerError:
    """The first machine, or the way to it, is gone: one line naming both ends."""
    if meeting is None:
        return WorkerError(f"could not join the job's store: {reason}")
    return WorkerError(f"{meeting.host} lost the job's store on {meeting.hosts[0]}: {reason}")


class Supervisor:
    def __init__(self, plan: Plan, meeting: Meeting):
        self.plan, self.meeting = plan, meeting
        self.restarts = 0

    def run(self) -> None:
        attempt, resume = 0, self.plan.resume
        while True:
            try:
                address, port = self.meeting.begin(attempt)
            except WorkerError as error:  # a node did not come (back)
                self.fail_job(str(error))
                raise
            failure = self.run_attempt(attempt, AttemptRendezvous(self.meeting, attempt, address, port), resume)
            if failure is None:
                return
            decision = self.decide(attempt) if self.meeting.leader else self.meeting.decision(attempt)
            if decision.completed and self.meeting.leader:
                print(f"shoal: the job completed; afterwards {failure}", file=sys.stderr)
            if decision.completed:
                return
            if not decision.restart:
                error = WorkerError(decision.message)
                error.exit_code = EXIT_USAGE if decision.usage else 1
                error.failure = WorkerFailed(**decision.failure) if decision.failure else None
                raise error
            attempt, resume = attempt + 1, True

    def run_attempt(self, attempt: int, rendezvous: AttemptRendezvous, resume: bool) -> WorkerError | None:
        """Run this node's workers once; report the outcome to the leader. Returns the failure, if any."""
        plan, meeting = self.plan, self.meeting
        watch = AttemptWatch(meeting, attempt)
        try:
            # the workers' keys are named by the job's secret: handed in their environment, never their argv
            with watch, workers_environment({SECRET_VARIABLE: meeting.secret}):
                launch(plan.job_file, plan.run_dir, workers=plan.workers, threads=plan.threads,
                       rendezvous=rendezvous, resume=resume, callbacks=plan.callbacks, server=plan.server,
                       counts=meeting.counts)
        except WorkerError as error:
            if watch.lost is not None:
                raise lost_store(watch.lost, meeting) from None
            # stopped by the watch: a cause only if a worker wrote one of its own first
            stopped = watch.stopped and error.failure is not None and error.failure.signal in ("SIGTERM", "SIGKILL")
            meeting.report(attempt, Report(meeting.node_rank, failure=failure_fields(error.failure),
                                           consequence=error.consequence or stopped,
                                           usage=error.exit_code == EXIT_USAGE))
            return error
        meeting.report(attempt, Report(meeting.node_rank, succeeded=True))
        if meeting.leader:  # a follower that failed while finishing learns the job is done anyway
            meeting.decide(attempt, Decision(restart=False, completed=True))
        return None

    def decide(self, attempt: int) -> Decision:
        """The leader: the root cause from every node's report, recorded; restart or stop, for every node."""
        meeting, run_dir = self.meeting, self.plan.run_dir
        ended = meeting.ended()
        if ended:  # stopped on another machine: nothing failed of itself
            append_event(run_dir, JobEnd(status="interrupted", message=ended))
            decision = Decision(restart=False, message=ended)
            meeting.decide(attempt, decision)
            return decision
        reports, missing = meeting.reports(attempt)
        silent = heartbeat.verdict(meeting.worker_store)
        cause, text = root_cause(reports, missing, silent, meeting.hosts, workers=meeting.counts)
        append_event(run_dir, cause)
        usage = any(report.usage for report in reports if not report.consequence)
        if any(report.succeeded for report in reports):  # workers pass their last barrier after the model is saved
            decision = Decision(restart=False, completed=True)
        elif usage or self.restarts >= self.plan.max_restarts:
            append_event(run_dir, JobEnd(status="failed", message=text))
            decision = Decision(restart=False, message=text, failure=failure_fields(cause), usage=usage)
        else:
            self.restarts += 1
            restart = self.plan.restart_record(run_dir, self.restarts)
            append_event(run_dir, restart)
            print(restart_line(text, restart, self.plan.max_restarts), file=sys.stderr, flush=True)
            decision = Decision(restart=True, message=text)
        meeting.decide(attempt, decision)
        return decision

    def fail_job(self, message: str) -> None:
        if self.meeting.leader:
            append_event(self.plan.run_dir, JobEnd(status="failed", message=message))
        self.meeting.end(message)


def root_cause(reports: list[Report], missing: list[int], silent: dict | None, hosts: list[str],
               workers: int | list[int] = 1) -> tuple[WorkerFailed, str]:
    """The failure to blame, as the event and one line, by shoal.cluster.verdict's order: a worker that
    stopped answering (from the workers' liveness), a node's own error, a node's worker killed or a node
    that sent no report, then the first that failed. Every node's worker count (`workers`, by node rank;
    one number: as many on each) places a rank that never beat on its host."""
    counts = [workers] * len(hosts) if isinstance(workers, int) else workers
    cause = verdict.root_cause(accounts(reports, missing, silent, hosts, counts))
    if cause is None:
        return WorkerFailed(message="the workers failed"), "the workers failed"
    if cause.kind is Kind.SILENT:
        failure = WorkerFailed(rank=cause.rank, host=cause.host, message=cause.message)
        return failure, f"worker rank {cause.rank} on {cause.host} {cause.message}; the others waited for it"
    if cause.node is not None:
        failure = WorkerFailed(host=cause.host, message=cause.message)
        return failure, f"{cause.host} (node {cause.node}): {cause.message}"
    failure = cause.details
    return failure, f"worker rank {failure.rank} on {failure.host} failed: {failure.message}"


def accounts(reports: list[Report], missing: list[int], silent: dict | None, hosts: list[str],
             counts: list[int]) -> list[Account]:
    """What every node reported, and the liveness's silent worker, as accounts for the verdict."""
    found = []
    if silent is not None:
        host = silent["host"] if silent["host"] != "?" else hosts[node_of_rank(counts, silent["rank"])]
        found.append(Account(Kind.SILENT, rank=silent["rank"], host=host, message=heartbeat.silence(silent)))
    for report in reports:
        if report.failure is not None:
            failure = WorkerFailed(**report.failure)
            kind = Kind.RAISED if failure.signal is None else Kind.KILLED
            found.append(Account(Kind.FOLLOWED if report.consequence else kind, rank=failure.rank,
                                         host=failure.host, message=failure.message, details=failure))
    message = "its launcher stopped answering (gone, or cut off)"
    found += [Account(Kind.KILLED, host=hosts[node], message=message, node=node) for node in missing]
    return found
