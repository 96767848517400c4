"""How the machines of a job meet, and meet again after a failure.

The first machine's launcher holds a small key-value store (torch's TCPStore, bound to the
address the others reach); every launcher joins it once, keeps its node rank for the whole
job and tells its worker count, which may differ between machines: once all have joined, each
reads every count, and node k's workers take the global ranks after those of nodes 0..k-1.
Each attempt to run the workers is numbered: all nodes join attempt n before any starts
its workers, a node whose workers fail reports why and flags the attempt, the others stop
theirs on seeing the flag, and the first node (the leader) decides from every report whether
all restart or all stop. A node that does not come back within the timeout fails the job with
its host named. torch's static rendezvous has no way to bring the other nodes back, and its
dynamic one chooses node ranks itself; this keeps `--node-rank` and one restart loop for both.

Anyone who reaches the store's port may send it requests (torch's TCPStore asks no password),
so every key below lives under a name only the job's secret computes and every value is sealed by it
(shoal.cluster.store.Sealed): a random secret on a single machine, `--secret-file`, SHOAL_JOB_SECRET or
`--rdzv-id` across machines, or the one a `--hosts` head hands its nodes on their input; machines
started by hand with none are refused unless the user says `--insecure`. The leader draws a fresh
instance for the job and tells it to each machine that joins, in answer to that machine's own nonce
(shoal.cluster.node.greeting); every other value is sealed over it, so a machine proves it holds the
secret with its claim and with each attempt's `joined` (bound to the instance and the attempt) before the
leader counts it, and nothing recorded from another job is believed. The secret
itself is never stored, written or sent. Node 0's store listens on loopback when the endpoint is a
loopback address.

Its keys are named in shoal.cluster.keys.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import socket
import stat
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo
from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

from shoal.cluster import keys
from shoal.cluster import store as stores
from shoal.cluster.interface import local_addresses
from shoal.cluster.node.greeting import Greeter, greet
from shoal.config import DEFAULT_PORT
from shoal.errors import ConfigError, WorkerError, first_line
from shoal.events import WorkerFailed

REPORT_SECONDS = 8.0  # how long the leader waits for every node's account of a failure
SILENT_SECONDS = 2.0  # a node whose launcher has not beaten for this long is gone: its account will not come


@dataclass
class Nodes:
    """Where this node stands in a multi-machine job (the command line's cluster arguments)."""

    count: int = 1
    """The machines in the job; with `minimum`, the most it takes."""
    minimum: int | None = None
    """With --nnodes MIN:MAX, MIN: the job goes on while at least this many remain."""
    rank: int | None = None
    endpoint: str | None = None
    run_id: str | None = None
    secret: str | None = None
    """What every node of the job holds and nobody else does (--secret-file, SHOAL_JOB_SECRET, --rdzv-id, or a
    --hosts head's)."""
    insecure: bool = False
    """--insecure: machines started by hand without a secret meet on a word anyone knows (a trusted network)."""

    @property
    def elastic(self) -> bool:
        """Whether machines may leave and join while the job runs (--nnodes MIN:MAX, MIN < MAX)."""
        return self.minimum is not None and self.minimum < self.count

    def address(self) -> tuple[str, int]:
        """The rendezvous endpoint as (host, port); a single machine uses 127.0.0.1 and a free port."""
        if self.endpoint is None:
            if self.count > 1:
                raise ConfigError("--rdzv-endpoint: HOST:PORT is required for a job of several machines "
                                  "(--nnodes, or the job's cluster.nodes, above 1)")
            return "127.0.0.1", 0
        host, _, port = self.endpoint.rpartition(":")
        if not host or host.endswith(":") or (self.endpoint.endswith("]") and self.endpoint.startswith("[")):
            return self.endpoint.strip("[]"), DEFAULT_PORT  # no port: a name, [IPv6] or a bare IPv6 address
        try:
            return host.strip("[]"), int(port)
        except ValueError:
            raise ConfigError(f"--rdzv-endpoint: {self.endpoint!r} is not HOST:PORT") from None


@dataclass
class Report:
    """One node's account of how an attempt ended for it."""

    node: int
    succeeded: bool = False
    failure: dict | None = None
    """A WorkerFailed's fields: this node's own root cause."""
    consequence: bool = False
    """Its workers only failed because another one did (a lost peer, stopped by the launcher)."""
    usage: bool = False
    """A user error (exit status 2): it would fail again the same way."""


@dataclass
class Decision:
    """The leader's verdict on a failed attempt, which every node follows."""

    restart: bool
    message: str = ""
    failure: dict | None = None
    usage: bool = False
    """The cause is the user's input (exit status 2)."""
    completed: bool = False
    """The job completed (a node that failed while finishing need not restart)."""
    regroup: bool = False
    """The machines change (--nnodes MIN:MAX): the next attempt has other members; not a failure to count."""
    dropped: list[int] | None = None
    """The node ranks the job goes on without (lost, or out of restarts)."""


def resolve(host: str) -> str:
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as error:
        raise ConfigError(f"--rdzv-endpoint: cannot resolve {host!r}: {error}") from None


def read_secret(path: Path) -> str:
    """The job's secret from a file only its owner may read (--secret-file): its text, or the hex of its bytes
    when they are not text (`head -c 32 /dev/urandom`). Nothing of its content shows in an error."""
    try:
        mode = os.stat(path).st_mode
        raw = Path(path).read_bytes().strip()
    except OSError as error:
        raise ConfigError(f"--secret-file: cannot read {path}: {error.strerror or error}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"--secret-file: {path} may be read by others (mode {stat.S_IMODE(mode):o}); "
                          f"chmod 600 {path}")
    if not raw:
        raise ConfigError(f"--secret-file: {path} is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.hex()
    return check_strength(text, f"--secret-file {path}")


MINIMUM_SECRET = 16
"""Characters a secret given by hand must have: the store's key names are HMACs of it that anyone may list, so a
short one (a word, a job's name) is guessed offline in moments."""


def check_strength(secret: str, source: str) -> str:
    """`secret` as given by `source` (an option or variable), or a ConfigError when it is too short to guess."""
    if len(secret) < MINIMUM_SECRET:
        raise ConfigError(f"{source}: the job's secret has {len(secret)} characters, too few to keep anyone who "
                          f"reaches the job's store from guessing it; give {MINIMUM_SECRET} or more random ones "
                          "(openssl rand -hex 16)")
    return secret


def job_secret(nodes: Nodes) -> str:
    """The secret the job's keys are named and sealed by: the one given, a fresh one on a single machine, or,
    with --insecure, a word anyone knows (said on stderr: anyone who reaches the store may then steer the job)."""
    if nodes.secret or nodes.run_id:
        return nodes.secret or nodes.run_id
    if nodes.count == 1:
        return secrets.token_hex(16)
    require_secret(nodes)
    print(f"shoal: warning: --insecure: the job's store at {nodes.endpoint} obeys anyone who can reach it",
          file=sys.stderr)
    return INSECURE_SECRET


def require_secret(nodes: Nodes) -> None:
    """A job of several machines started by hand has a secret, or says --insecure; else a ConfigError saying how
    to make one (before anything of the run is written)."""
    if nodes.count > 1 and not (nodes.secret or nodes.run_id or nodes.insecure):
        raise ConfigError(f"--rdzv-endpoint {nodes.endpoint}: a job of several machines needs a secret that every "
                          "machine holds: make one (openssl rand -hex 16 > FILE; chmod 600 FILE) and give each "
                          "machine --secret-file FILE (or SHOAL_JOB_SECRET in its environment), or say --insecure "
                          "on a network where nobody else can reach the job's ports")


INSECURE_SECRET = "shoal"
"""The secret of machines started by hand with --insecure: anyone knows it."""


class Meeting:
    """This node's membership of the job: its node rank, the hosts and their worker counts, and the attempts."""

    def __init__(self, nodes: Nodes, timeout: float, workers: int = 1, streamed: bool = False):
        """`streamed`: this machine lacks a dataset of the job's; it says so with its claim, for the first."""
        self.nodes, self.count, self.timeout, self.workers = nodes, nodes.count, timeout, workers
        self.streamed = streamed
        self.host = socket.gethostname()
        self.endpoint_host, self.port = nodes.address()
        self.secret = job_secret(nodes)
        self.instance = ""  # the job's instance, drawn by the leader: set by _open
        self.greeter: Greeter | None = None  # the leader's answers to machines that join
        self.worker_store: stores.Sealed | None = None  # the leader's store for attempt n's workers
        self.store, self.node_rank, self.bind, self.port = self._open()
        self.leader = self.node_rank == 0
        self.hosts = self._introduce()  # by position in `members`
        self.counts = self._counts()  # by position: the workers of members[k] are ranks sum(counts[:k]) and on
        self.members = list(range(self.count))  # the node ranks in the latest attempt, in order
        self.attempt = -1  # the latest attempt begun
        self.gone: set[int] = set()  # nodes known to have left without a word

    # ------------------------------------------------------------------ joining once

    def _open(self) -> tuple[stores.Sealed, int, str | None, int]:
        """Hold the store (the leader) or join it; returns (store, node rank, address the leader binds, port)."""
        nodes, host = self.nodes, self.endpoint_host
        deadline = time.monotonic() + self.timeout
        bind = bind_address(self.endpoint_host, nodes.endpoint is not None)
        if bind is not None and nodes.rank in (None, 0):
            try:
                server = stores.Bounded(stores.serve(bind, self.port))
                self.instance = secrets.token_hex(16)  # every value of this job is sealed over it
                introduction = stores.Sealed(server, self.secret)
                introduction.set(keys.INSTANCE, "a shoal job")  # what tells a machine with another secret so
                self.greeter = Greeter(introduction, self.instance)
                server.set(keys.PUBLIC, "1")
                return stores.Sealed(server, self.secret, self.instance), 0, bind, server.port
            except (OSError, RuntimeError) as error:
                if nodes.rank == 0:
                    raise WorkerError(f"{self.host}: cannot listen on {host}:{self.port}: {first_line(error)}") \
                        from None
                # another node of this machine holds it: join as a follower
        if nodes.rank == 0:
            raise ConfigError(f"--rdzv-endpoint: {host} is not an address of this machine ({self.host}); "
                              "node 0 holds the job's store there")
        server = stores.connect(host, self.port, deadline, "the job's store")
        if stores.wait_for(server, [keys.PUBLIC], deadline):
            raise WorkerError(f"{host}:{self.port} answers but holds no shoal job")
        introduction = stores.Sealed(server, self.secret)
        if not introduction.check([keys.INSTANCE]):  # set before the public key: this job's secret is not ours
            raise ConfigError(f"--rdzv-endpoint: {host}:{self.port} holds a shoal job with another secret "
                              "(--secret-file, SHOAL_JOB_SECRET or --rdzv-id)")
        self.instance = greet(introduction, deadline, f"{host}:{self.port}")  # the live one, not a recorded one
        store = stores.Sealed(server, self.secret, self.instance)
        rank = nodes.rank if nodes.rank is not None else store.add(keys.NEXT_NODE, 1)
        if rank >= self.count and not self.nodes.elastic:  # an elastic job numbers every arrival
            raise ConfigError(f"--nnodes: {host}:{self.port} already has its {self.count} machines")
        return store, rank, None, self.port

    def _introduce(self) -> list[str]:
        """Claim the node rank and learn every node's host."""
        self._claim()
        names = [keys.node(rank, "host") for rank in range(self.count)]
        missing = self._wait(names, time.monotonic() + self.timeout)
        if missing:
            absent = ", ".join(str(names.index(key)) for key in missing)
            raise WorkerError(f"{self.host}: {self.count - len(missing)} of {self.count} machines joined "
                              f"{self.endpoint_host}:{self.port} within {self.timeout:g} s (missing node {absent})")
        return [value.decode() for value in self.store.multi_get(names)]

    def _claim(self) -> None:
        """Take this node's rank and tell its host, its worker count and whether it lacks the job's data."""
        claim = f"{self.host} (pid {os.getpid()}, {uuid.uuid4().hex[:8]})"
        if self.store.compare_set(keys.node(self.node_rank, "claim"), "", claim).decode() != claim:
            taken = self.store.get(keys.node(self.node_rank, "claim")).decode()
            raise ConfigError(f"--node-rank: node {self.node_rank} is already taken by {taken}; give every machine "
                              "its own rank, or none to any")
        # both before the host: every machine's are there once every host is
        self.store.set(keys.node(self.node_rank, "streamed"), "1" if self.streamed else "")
        self.store.set(keys.node(self.node_rank, "workers"), str(self.workers))
        self.store.set(keys.node(self.node_rank, "host"), self.host)

    def _counts(self) -> list[int]:
        """Every node's worker count, by node rank: each node set its own before its host, so all are there
        once every host is. Read once: a node keeps its count, as its rank, for the whole job."""
        names = [keys.node(rank, "workers") for rank in range(self.count)]
        return [int(value) for value in self.store.multi_get(names)]

    def streaming(self) -> list[str]:
        """The hosts of the other machines that lack a dataset of the job's and stream it from the first one,
        as each said with its claim: all are known once the machines met, so nobody waits for a request."""
        names = [keys.node(rank, "streamed") for rank in self.members[1:]]
        values = self.store.multi_get(names) if names else []
        return [host for host, value in zip(self.hosts[1:], values) if value == b"1"]

    @property
    def position(self) -> int:
        """This node's place among the latest attempt's members: its node rank for torch's agent."""
        return self.members.index(self.node_rank)

    def host_of(self, node_rank: int) -> str:
        """The host of a node of the latest attempt."""
        return self.hosts[self.members.index(node_rank)]

    def layout(self) -> str:
        """The machines and their workers, in rank order, for a message: `node 0 (host0) 2, node 1 (host1) 1`."""
        return ", ".join(f"node {rank} ({host}) {count}" for rank, (host, count) in
                         enumerate(zip(self.hosts, self.counts)))

    # ------------------------------------------------------------------ each attempt

    def begin(self, attempt: int) -> tuple[str, int]:
        """Every node joins attempt `attempt`; returns (address, port) of its workers' store."""
        self.attempt = attempt
        if self.leader:
            self.worker_store = None  # the last attempt's store closes
            server = stores.serve(self.bind)
            self.worker_store = stores.Sealed(server, self.secret, self.worker_context(attempt))
            self.store.set(keys.attempt(attempt, "port"), str(server.port))
        self.store.set(keys.joined(attempt, self.node_rank), "1")
        joined = [keys.joined(attempt, rank) for rank in self.members]
        missing = self._wait([keys.attempt(attempt, "port"), *joined], time.monotonic() + self.timeout)
        if missing:
            gone = [keys.node_of(key) for key in missing if key in joined]
            self.gone.update(gone)
            names = ", ".join(f"{self.host_of(rank)} (node {rank})" for rank in gone) or self.hosts[0]
            raise WorkerError(f"{names} did not come back within {self.timeout:g} s (cluster.timeout)")
        self.gone.difference_update(self.members)  # every node is back for this attempt
        port = int(self.store.get(keys.attempt(attempt, "port")))
        address = "127.0.0.1" if self.nodes.endpoint is None else self.endpoint_host
        return address, port

    def report(self, attempt: int, report: Report) -> None:
        self.store.set(keys.report(attempt, self.node_rank), json.dumps(asdict(report)))
        if not report.succeeded:
            self.store.compare_set(keys.attempt(attempt, "failed"), "", str(self.node_rank))

    def reports(self, attempt: int, seconds: float = REPORT_SECONDS) -> tuple[list[Report], list[int]]:
        """(the reports of attempt `attempt`, the nodes that sent none within `seconds`, or sooner once every
        node still silent has also stopped beating for SILENT_SECONDS: its launcher is gone)."""
        names = [keys.report(attempt, rank) for rank in self.members]
        deadline, beats = time.monotonic() + seconds, {}
        while True:
            missing = self._wait(names, min(deadline, time.monotonic() + SILENT_SECONDS), watch_end=False)
            if not missing or time.monotonic() >= deadline:
                break
            now = {key: int(self.store.add(keys.node(keys.node_of(key), "alive"), 0)) for key in missing}
            if beats and all(now[key] == beats.get(key) for key in missing):
                break
            beats = now
        sent = [key for key in names if key not in missing]
        reports = [Report(**json.loads(value)) for value in self.store.multi_get(sent)] if sent else []
        absent = [keys.node_of(key) for key in missing]
        self.gone.update(absent)
        return reports, absent

    def decide(self, attempt: int, decision: Decision) -> None:
        self.store.set(keys.attempt(attempt, "decision"), json.dumps(asdict(decision)))

    def decision(self, attempt: int, seconds: float | None = None) -> Decision:
        """The leader's decision on a failed attempt (a follower waits for it); `seconds`: on one that ended
        well, which the leader decides once its workers are done."""
        key = keys.attempt(attempt, "decision")
        wait = 2 * REPORT_SECONDS + stores.REQUEST_SECONDS if seconds is None else seconds
        if self._wait([key], time.monotonic() + wait):
            raise WorkerError(f"{self.hosts[0]} (node 0) decided nothing within {wait:g} s after attempt {attempt} "
                              "ended")
        return Decision(**json.loads(self.store.get(key)))

    # ------------------------------------------------------------------ the whole job's end

    def end(self, message: str) -> None:
        """Every node leaves (a stop, or a failure outside an attempt); best effort."""
        with contextlib.suppress(*stores.STORE_ERRORS):  # the store already gone or out of reach
            self.store.compare_set(keys.END, "", message)

    def leave(self) -> None:
        """A follower is done with the job's store: the leader may close it (best effort)."""
        with contextlib.suppress(*stores.STORE_ERRORS):
            self.store.set(keys.left(self.node_rank), "1")

    def linger(self, seconds: float = REPORT_SECONDS) -> None:
        """The leader keeps the store up until every follower still there has read the decision or the end."""
        with contextlib.suppress(*stores.STORE_ERRORS):
            there = [rank for rank in self.members[1:] if rank not in self.gone and
                     (self.attempt < 0 or self.store.check([keys.joined(self.attempt, rank)]))]
            there += self.waiting()
            self._wait([keys.left(rank) for rank in there], time.monotonic() + seconds, watch_end=False)

    def waiting(self) -> list[int]:
        """Nodes that wait to join the next attempt (none: every node of a fixed job joins every attempt)."""
        return []

    def wait_for(self, key: str, seconds: float = REPORT_SECONDS) -> bool:
        """Wait for one key the leader sets once the machines met; True when it never came."""
        return bool(self._wait([key], time.monotonic() + seconds))

    def ended(self) -> str | None:
        return self.store.get(keys.END).decode() if self.store.check([keys.END]) else None

    def _wait(self, names: list[str], deadline: float, watch_end: bool = True) -> list[str]:
        """Wait for the keys `names`; an `end` set meanwhile by any node raises it here."""
        while True:
            missing = stores.wait_for(self.store, names, min(deadline, time.monotonic() + 1.0))
            if not missing or time.monotonic() >= deadline:
                return missing
            ended = self.ended() if watch_end else None
            if ended is not None:
                raise WorkerError(ended)

    def watcher_store(self) -> stores.Sealed:
        """A second connection, for the thread that watches an attempt while the agent uses the first."""
        address = self.bind if self.bind not in (None, "0.0.0.0") else self.endpoint_host
        server = stores.connect(address, self.port, time.monotonic() + stores.REQUEST_SECONDS, "the job's store")
        return stores.Sealed(server, self.secret, self.instance)

    def worker_context(self, attempt: int) -> str:
        """What the seals of attempt `attempt`'s workers' store are bound to: a value of another attempt's store
        (a verdict, a regroup) is not believed in this one."""
        return f"{self.instance}/attempt/{attempt}"

    def close(self) -> None:
        if self.greeter is not None:
            self.greeter.stop()
        self.worker_store = None
        self.store = None


def bind_address(endpoint_host: str, given: bool) -> str | None:
    """The address node 0's stores listen on, or None when the endpoint is not on this machine. A name that
    resolves to loopback (localhost, 127.0.0.1) keeps them on loopback, except this machine's own name: a
    stock Debian or Ubuntu box maps it to 127.0.1.1, while the other machines reach it under that name, so
    the stores listen on every address (the job's secret guards them)."""
    if not given:
        return "127.0.0.1"
    address = resolve(endpoint_host)
    if ipaddress.ip_address(address).is_loopback:
        return "0.0.0.0" if is_own_name(endpoint_host) else address
    return address if address in local_addresses() else None


def is_own_name(host: str) -> bool:
    """Whether `host` is this machine's name (short or fully qualified), as other machines would call it."""
    names = {socket.gethostname(), socket.getfqdn()}
    names |= {name.split(".")[0] for name in names}
    return host.lower() in {name.lower() for name in names if name and name != "localhost"}


class AttemptRendezvous(RendezvousHandler):
    """torch's agent's view of one attempt: everything was agreed beforehand, so nothing waits here."""

    def __init__(self, meeting: Meeting, attempt: int, address: str, port: int):
        self.store = dist.HashStore()  # torch's agent asks none of it: see shoal.cluster.node.agent.NodeAgent
        self.rank, self.count = meeting.position, len(meeting.members)
        self.address, self.port = address, port

    def get_backend(self) -> str:
        return "shoal"

    @property
    def use_agent_store(self) -> bool:
        return True  # the workers are clients of the attempt's store

    def next_rendezvous(self) -> RendezvousInfo:
        return RendezvousInfo(self.store, self.rank, self.count, RendezvousStoreInfo(self.address, self.port))

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return "shoal"

    def shutdown(self) -> bool:
        return True


def failure_fields(failure: WorkerFailed | None) -> dict | None:
    return None if failure is None else {key: value for key, value in asdict(failure).items() if key != "time"}
