"""One node's launcher from start to end: meet the other machines, run attempts, restart together.

Every node runs a supervisor. All of them join the job's store (shoal.cluster.node.rendezvous), check
the job against its world size (every machine's worker count summed, known only then), run
numbered attempts of their workers, and after a failure follow the first node's decision:
restart every node's workers from the newest checkpoint, or stop. The first node (the leader,
whose run directory holds the events) finds the root cause among every node's reports and the
workers' liveness, and records each failure, restart and the job's end, whatever happened.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch.distributed as dist

from shoal.cluster import heartbeat, keys, verdict
from shoal.cluster.env import threads_per_worker
from shoal.cluster.node.agent import node_of_rank
from shoal.cluster.node.forkserver import ForkServer
from shoal.cluster.node.launch import launch, restart_line, restart_start, workers_environment
from shoal.cluster.node.membership import ElasticMeeting, LeftJob
from shoal.cluster.node.rendezvous import AttemptRendezvous, Decision, Meeting, Nodes, Report, failure_fields
from shoal.cluster.node.watch import AttemptWatch
from shoal.cluster.regroup import ELASTIC_VARIABLE
from shoal.cluster.signals import Interrupted, interruptible
from shoal.cluster.store import CONTEXT_VARIABLE, POLL_SECONDS, SECRET_VARIABLE, StoreUnreachable
from shoal.cluster.verdict import Account, Kind
from shoal.config import ClusterConfig
from shoal.data.source import SECRET_VARIABLE as DATA_SECRET
from shoal.data.source import SERVER_VARIABLE, readable_here
from shoal.errors import EXIT_USAGE, ConfigError, WorkerError, first_line
from shoal.events import EVENTS_FILE, JobEnd, JobRestarted, Membership, WorkerFailed, append_event


class JobHooks(Protocol):
    """What the supervisor asks of training, which shoal.cluster does not import (shoal.launching's Launch
    answers it with training's functions)."""

    def check_layout(self, world_size: int) -> None:
        """Training's checks for a job of this many workers in all (the algorithm's and the rows', and a
        resume's checkpoints), raising ConfigError: across machines the total is known only once all have met."""

    def restart_record(self, run_dir: Path, restart: int) -> JobRestarted:
        """The `job_restarted` event of restart number `restart`, from the run's newest checkpoint."""

    def membership_record(self, run_dir: Path, world_size: int) -> Membership:
        """The `membership` event for a new set of machines of `world_size` workers in all: the epoch it goes on
        from and the shares (the supervisor adds the machines)."""


@dataclass
class NodeJob:
    """What every attempt on this node runs: the launcher's plain values (shoal.launching's Launch)."""

    job_file: Path
    run_dir: Path
    cluster: ClusterConfig
    """The job's [cluster] table as resolved for this machine: its worker count is this machine's."""
    datasets: list[str] = field(default_factory=list)
    """The job's datasets as it names them: the first machine serves those it holds to the others."""
    streamed: bool = False
    """This machine lacks the job's datasets: it streams them from the first machine's data server."""
    elastic: bool = False
    """Machines may leave and join (--nnodes MIN:MAX): shoal.cluster.node.membership's meeting."""
    resume: bool = False
    max_restarts: int = 0
    callbacks: Path | None = None
    """The caller's callbacks, written by value (`shoal.fit(callbacks=...)`), for the coordinator."""
    server: ForkServer | None = None
    """The caller's fork server (shoal.cluster.node.forkserver), which every attempt's workers fork from."""

    @property
    def threads(self) -> int:
        """Each worker's compute threads: the job's, or this machine's cores shared among its workers."""
        return threads_per_worker(self.cluster.threads, self.cluster.workers)


def supervise(job: NodeJob, nodes: Nodes, hooks: JobHooks) -> None:
    """Run the job's workers on this node until the job completes; raise WorkerError or Interrupted."""
    meeting = data_server = None
    with interruptible():
        try:
            if job.elastic:
                meeting = ElasticMeeting(nodes, job.cluster.timeout, job.cluster.workers, job.cluster.rejoin_timeout,
                                        hooks.check_layout)
            else:
                meeting = Meeting(nodes, job.cluster.timeout, job.cluster.workers, streamed=job.streamed)
            if meeting.leader and nodes.count > 1 and not job.resume and (job.run_dir / EVENTS_FILE).exists():
                # the others may share the folder (and so were let in); the first machine's must hold no run yet
                raise ConfigError(f"{job.run_dir}: already holds a run; choose another --run-dir")
            data_server = serve_data(job, meeting) if nodes.count > 1 else None
            if not job.elastic:
                check_layout(hooks, meeting)
            Supervisor(job, meeting, hooks).run()
        except Interrupted as interrupt:
            if job.elastic and meeting is not None and not meeting.leader:  # one machine taken out
                print(f"shoal: {meeting.host} leaves the job ({interrupt.signal.name}); it goes on without this "
                      "machine", file=sys.stderr, flush=True)
                meeting.say_leaving(interrupt.signal.name)
                interrupt.job_goes_on = True
                raise
            if meeting is not None:
                meeting.end(f"stopped by {interrupt.signal.name} on {meeting.host}")
            if records_events(meeting, nodes):
                append_event(job.run_dir, JobEnd(status="interrupted", message=str(interrupt)))
            raise
        except LeftJob:  # the job goes on without this machine: it only leaves
            raise
        except Exception as error:  # whatever it was, the other machines must not wait for this one
            if isinstance(error, (dist.DistError, StoreUnreachable)):
                error = lost_store(first_line(error), meeting)
            if meeting is not None:
                meeting.end(str(error))
                if meeting.leader and not isinstance(error, WorkerError):  # a WorkerError's end is recorded
                    append_event(job.run_dir, JobEnd(status="failed", message=first_line(error)))
            raise error from None
        finally:
            if meeting is not None:
                meeting.linger() if meeting.leader else meeting.leave()
                meeting.close()
            if data_server is not None:
                data_server.close()


def serve_data(job: NodeJob, meeting: Meeting):
    """The first machine serves the job's datasets it holds, read-only and to the job's secret only, to the
    machines that lack one (`start_data_server`); such a machine learns where (and so do its workers, from this
    process's environment). Returns the server."""
    if meeting.leader:
        return start_data_server(job, meeting)
    if job.streamed:
        missing = next(path for path in job.datasets if not readable_here(path))
        port = data_port(meeting, job.cluster.timeout, missing)
        if not port:
            raise ConfigError(f"{missing}: not on this machine ({meeting.host}), and the first machine "
                              f"({meeting.endpoint_host}) does not serve it (it serves the other machines the "
                              "datasets it holds)")
        host = f"[{meeting.endpoint_host}]" if ":" in meeting.endpoint_host else meeting.endpoint_host
        # the launcher's own checks and its workers read the datasets from there (the launcher is the job's)
        os.environ.update({SERVER_VARIABLE: f"{host}:{port}", DATA_SECRET: meeting.secret})
    return None


def start_data_server(job: NodeJob, meeting: Meeting):
    """The first machine's data server, started once the machines met and before any worker: in a fixed job only
    when another machine said with its claim that it lacks a dataset (a gRPC server's threads beside the
    workers of a one-core machine slowed its epochs measurably: tests/cluster/test_plan.py), in a job of
    changing machines always (one that joins later may lack them). Writes its port, "" for none."""
    wanting = meeting.streaming()
    held = {path: path for path in job.datasets if "://" not in path and readable_here(path)} \
        if job.elastic or wanting else {}
    server = None
    if held:
        from shoal.data.flight import DataServer  # gRPC, loaded only where a job spans machines

        try:
            server = DataServer(held, meeting.secret, host=meeting.bind or meeting.endpoint_host)
        except Exception as error:  # the others may see the data themselves: a machine that needs it says so
            print(f"shoal: warning: cannot serve the job's datasets to the other machines: {first_line(error)}",
                  file=sys.stderr, flush=True)
    if server is not None and wanting:
        print(f"shoal: {meeting.host} serves the job's datasets to {', '.join(wanting)}, which lack them",
              file=sys.stderr, flush=True)
    meeting.store.set(keys.DATA_PORT, str(server.port) if server else "")  # "": it serves none
    return server


def data_port(meeting: Meeting, seconds: float, missing: str) -> str:
    """Where the first machine serves the datasets ("": nowhere), as its launcher sealed it: a port anyone else
    wrote there is a one-line error at once, never an address rows are read from."""
    deadline = time.monotonic() + seconds
    while not meeting.store.check([keys.DATA_PORT]):
        if meeting.store.forged(keys.DATA_PORT):
            raise WorkerError(f"{missing}: not on this machine ({meeting.host}), and where the first machine serves "
                              "it is spoiled: the job's store holds a data server port that the job's secret did "
                              "not make (a process without the secret reaches the store); no rows were read")
        ended = meeting.ended()
        if ended is not None:
            raise WorkerError(ended)
        if time.monotonic() >= deadline:
            return ""
        time.sleep(POLL_SECONDS)
    return meeting.store.get(keys.DATA_PORT).decode()


def check_layout(hooks: JobHooks, meeting: Meeting) -> None:
    """Every node checks the job's world size itself once the counts are known (each finds the same), so a
    layout that cannot work stops every machine at once, in one line naming them."""
    try:
        hooks.check_layout(sum(meeting.counts))
    except ConfigError as error:
        if len(meeting.members) == 1:
            raise
        raise ConfigError(f"{first_line(error)} (workers on each machine: {meeting.layout()})") from None


def records_events(meeting: Meeting | None, nodes: Nodes) -> bool:
    """Whether this node writes the job's events: the leader, or node 0 before the machines met."""
    return meeting.leader if meeting is not None else nodes.count == 1 or nodes.rank == 0


def lost_store(reason: str, meeting: Meeting | None) -> WorkerError:
    """The first machine, or the way to it, is gone: one line naming both ends."""
    if meeting is None:
        return WorkerError(f"could not join the job's store: {reason}")
    first = meeting.hosts[0] if meeting.hosts else meeting.endpoint_host
    return WorkerError(f"{meeting.host} lost the job's store on {first}: {reason}")


class Supervisor:
    def __init__(self, job: NodeJob, meeting: Meeting, hooks: JobHooks):
        self.job, self.meeting, self.hooks = job, meeting, hooks
        self.restarts = 0
        self.failures: dict[int, int] = {}  # by node rank, in a job of changing machines: its restarts used
        self.machine_restarts = 0  # restarts of a job of changing machines (counted per machine, above)
        self.reasons: dict[str, str] = {}  # by host: why it left, for the next membership event
        self.own_failure: WorkerError | None = None  # this node's last failed attempt's, with any user traceback

    def run(self) -> None:
        attempt = self.first_attempt()
        resume = self.job.resume or attempt > 0  # a machine that joins a running job goes on from its checkpoint
        while True:
            try:
                address, port = self.meeting.begin(attempt)
            except LeftJob:  # the others go on without this machine
                raise
            except WorkerError as error:  # a node did not come (back)
                self.fail_job(str(error))
                raise
            attempt = self.meeting.attempt  # a machine that arrived late joins a later one
            resume = resume or attempt > 0  # ... and goes on from the job's checkpoint
            self.begun(attempt)
            failure = self.run_attempt(attempt, AttemptRendezvous(self.meeting, attempt, address, port), resume)
            if failure is None:
                decision = self.after_success(attempt)
                if decision is None or decision.completed:
                    return
            else:
                decision = self.decide(attempt) if self.meeting.leader else self.meeting.decision(attempt)
            if decision.completed and self.meeting.leader:
                print(f"shoal: the job completed; afterwards {failure}", file=sys.stderr)
            if decision.completed:
                return
            if decision.dropped and self.meeting.node_rank in decision.dropped:
                raise LeftJob(f"{self.meeting.host} leaves the job, which goes on without it: {decision.message}")
            if not decision.restart:
                error = WorkerError(decision.message)
                error.exit_code = EXIT_USAGE if decision.usage else 1
                error.failure = WorkerFailed(**decision.failure) if decision.failure else None
                raise error
            attempt, resume = attempt + 1, True

    def first_attempt(self) -> int:
        """0, or for a machine joining a running job of changing machines the next attempt."""
        return self.meeting.first_attempt() if self.job.elastic else 0

    def begun(self, attempt: int) -> None:
        """Every machine has joined `attempt`: a job of changing machines checks the new world size on every
        machine, and the leader records who left or joined."""
        if not self.job.elastic:
            return
        check_layout(self.hooks, self.meeting)
        meeting = self.meeting
        left, joined = meeting.changes()
        if meeting.leader and (left or joined):
            reason = "; ".join(f"{host} {self.reasons.pop(host, 'left')}" for host in left) or \
                ("the first machines met" if not meeting.previous else f"{', '.join(joined)} joined")
            record = self.hooks.membership_record(self.job.run_dir, sum(meeting.counts))
            record.attempt, record.hosts, record.workers, record.left, record.joined, record.reason = \
                attempt, meeting.hosts, meeting.counts, left, joined, reason
            append_event(self.job.run_dir, record)
            print(f"shoal: machines now {meeting.layout()}: {reason}", file=sys.stderr, flush=True)

    def after_success(self, attempt: int) -> Decision | None:
        """What follows an attempt whose workers all ended well: the job is done (None), or in a job of
        changing machines the workers stopped at an epoch's end for machines waiting to join."""
        if not self.job.elastic:
            return None
        meeting = self.meeting
        if not meeting.leader:  # rank 0 may take a while to save the model and close its loggers
            return meeting.decision(attempt, seconds=self.job.cluster.timeout)
        decision = self.regrouped() or Decision(restart=False, completed=True)
        meeting.decide(attempt, decision)
        if decision.completed:  # a machine still waiting to join learns the job is over
            meeting.end("the job completed before this machine could join")
        return decision

    def regrouped(self) -> Decision | None:
        """In a job of changing machines, the workers' stop for machines waiting to join (rank 0 said so)."""
        store = self.meeting.worker_store
        if not self.job.elastic or store is None or not store.check([keys.REGROUPED]):
            return None
        return Decision(restart=True, regroup=True, message="machines join")

    def run_attempt(self, attempt: int, rendezvous: AttemptRendezvous, resume: bool) -> WorkerError | None:
        """Run this node's workers once; report the outcome to the leader. Returns the failure, if any."""
        job, meeting = self.job, self.meeting
        watch = AttemptWatch(meeting, attempt)
        self.own_failure = None
        try:
            # the workers' keys are named by the job's secret: handed in their environment, never their argv
            with watch, workers_environment(self.worker_variables(attempt)):
                launch(job.job_file, job.run_dir, workers=job.cluster.workers, threads=job.threads,
                       rendezvous=rendezvous, resume=resume, callbacks=job.callbacks, server=job.server,
                       counts=meeting.counts)
        except WorkerError as error:
            if watch.lost is not None:
                raise lost_store(watch.lost, meeting) from None
            # stopped by the watch: a cause only if a worker wrote one of its own first
            stopped = watch.stopped and error.failure is not None and error.failure.signal in ("SIGTERM", "SIGKILL")
            self.own_failure = error
            meeting.report(attempt, Report(meeting.node_rank, failure=failure_fields(error.failure),
                                           consequence=error.consequence or stopped,
                                           usage=error.exit_code == EXIT_USAGE))
            return error
        meeting.report(attempt, Report(meeting.node_rank, succeeded=True))
        if meeting.leader and not self.job.elastic:  # a follower that failed while finishing learns it is done
            meeting.decide(attempt, Decision(restart=False, completed=True))
        return None

    def worker_variables(self, attempt: int) -> dict[str, str]:
        """What the workers learn from their environment: the job's secret (never on their command line), what
        their store's seals are bound to and, in a job of changing machines, that they stop at an epoch's end
        when machines join."""
        variables = {SECRET_VARIABLE: self.meeting.secret, CONTEXT_VARIABLE: self.meeting.worker_context(attempt)}
        if self.job.elastic:
            variables[ELASTIC_VARIABLE] = "1"
        return variables

    def decide(self, attempt: int) -> Decision:
        """The leader: the root cause from every node's report, recorded; restart or stop, for every node."""
        meeting, run_dir = self.meeting, self.job.run_dir
        ended = meeting.ended()
        if ended:  # stopped on another machine: nothing failed of itself
            append_event(run_dir, JobEnd(status="interrupted", message=ended))
            decision = Decision(restart=False, message=ended)
            meeting.decide(attempt, decision)
            return decision
        reports, missing = meeting.reports(attempt)
        silent = heartbeat.verdict(meeting.worker_store)
        positions = [meeting.members.index(node) for node in missing]
        cause, text = root_cause(reports, positions, silent, meeting.hosts, workers=meeting.counts)
        append_event(run_dir, cause)
        usage = any(report.usage for report in reports if not report.consequence)
        if (regrouped := self.regrouped()) is not None:  # stopped for machines joining: a worker failed after
            decision = regrouped
            if missing:  # and machines that sent nothing are not waited for again
                meeting.drop(missing)
                decision.dropped = missing
        elif any(report.succeeded for report in reports):  # workers pass their last barrier after the model is saved
            decision = Decision(restart=False, completed=True)
        elif not usage and (regrouped := self.regroup(cause, missing, text)) is not None:
            decision = regrouped
        elif usage or self.restarts >= self.job.max_restarts:
            append_event(run_dir, self.job_failed(cause, text))
            decision = Decision(restart=False, message=text, failure=failure_fields(cause), usage=usage)
        else:
            self.restarts += 1
            restart = self.hooks.restart_record(run_dir, self.restarts)
            append_event(run_dir, restart)
            print(restart_line(text, restart, self.job.max_restarts), file=sys.stderr, flush=True)
            decision = Decision(restart=True, message=text)
        meeting.decide(attempt, decision)
        return decision

    def regroup(self, cause: WorkerFailed, missing: list[int], text: str) -> Decision | None:
        """A job of changing machines counts restarts per machine: it restarts on the same machines, or goes on
        without those lost and those out of restarts (the first machine, which holds the job's store, cannot
        leave: out of restarts, the job stops). None: a fixed job restarts or stops as before."""
        if not self.job.elastic:
            return None
        meeting, run_dir = self.meeting, self.job.run_dir
        if self.blamed(cause, missing) is None and not missing:
            return None  # no machine to blame (or to tell apart): restarts are counted as a fixed job's
        out = self.out_of_job(cause, missing)
        if meeting.node_rank in out:
            append_event(run_dir, self.job_failed(cause, text))
            return Decision(restart=False, message=text, failure=failure_fields(cause))
        if not out:  # the blamed machine has restarts left: numbered as the run's restarts, counted per machine
            self.machine_restarts += 1
            restart = self.hooks.restart_record(run_dir, self.machine_restarts)
            append_event(run_dir, restart)
            blamed = self.blamed(cause, missing)
            print(f"shoal: {text}; restarting from {restart_start(restart)}, restart {self.failures[blamed]} of "
                  f"{self.job.max_restarts} for {meeting.host_of(blamed)}", file=sys.stderr, flush=True)
            return Decision(restart=True, message=text)
        meeting.drop(out)  # the next attempt waits cluster.rejoin_timeout for them, or others, to come
        print(f"shoal: {text}; going on without {', '.join(meeting.host_of(node) for node in out)}",
              file=sys.stderr, flush=True)
        return Decision(restart=True, regroup=True, message=text, dropped=out)

    def out_of_job(self, cause: WorkerFailed, missing: list[int]) -> list[int]:
        """The nodes a failure takes out: those that sent no report, and the one blamed once it has failed more
        than --max-restarts times; why, by host, for the next membership event."""
        meeting = self.meeting
        blamed = self.blamed(cause, missing)
        if blamed is not None and blamed not in missing:
            self.failures[blamed] = self.failures.get(blamed, 0) + 1
        spent = [node for node in meeting.members if node not in missing and
                 self.failures.get(node, 0) > self.job.max_restarts]
        for node in missing:
            self.reasons[meeting.host_of(node)] = meeting.leaving(node) or "was lost (its launcher stopped answering)"
        for node in spent:
            self.reasons[meeting.host_of(node)] = \
                f"failed {self.failures[node]} times (--max-restarts {self.job.max_restarts})"
        return sorted({*missing, *spent})

    def blamed(self, cause: WorkerFailed, missing: list[int]) -> int | None:
        """The node whose failure `cause` is: its worker's rank's node, else its host's when that name is one
        machine's only; None for a node that sent no account (left out as lost) or none to tell."""
        meeting = self.meeting
        if cause.rank is not None and cause.rank < sum(meeting.counts):
            return meeting.members[node_of_rank(meeting.counts, cause.rank)]
        if missing or meeting.hosts.count(cause.host) != 1:
            return None
        return meeting.members[meeting.hosts.index(cause.host)]

    def job_failed(self, cause: WorkerFailed, text: str) -> JobEnd:
        """The job's end for `cause`, with the user's traceback when the cause is an error in the user's code on
        this machine (another machine's worker's traceback is on that machine's stderr)."""
        own = self.own_failure
        mine = own is not None and own.failure is not None and failure_fields(own.failure) == failure_fields(cause)
        return JobEnd(status="failed", message=text, traceback=getattr(own, "user_traceback", None) if mine else None)

    def fail_job(self, message: str) -> None:
        if self.meeting.leader:
            append_event(self.job.run_dir, JobEnd(status="failed", message=message))
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
