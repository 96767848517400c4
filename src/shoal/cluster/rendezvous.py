"""How the machines of a job meet, and meet again after a failure.

The first machine's launcher holds a small key-value store (torch's TCPStore, bound to the
address the others reach); every launcher joins it once and keeps its node rank for the whole
job. Each attempt to run the workers is numbered: all nodes join attempt n before any starts
its workers, a node whose workers fail reports why and flags the attempt, the others stop
theirs on seeing the flag, and the first node (the leader) decides from every report whether
all restart or all stop. A node that does not come back within the timeout fails the job with
its host named. torch's static rendezvous has no way to bring the other nodes back, and its
dynamic one chooses node ranks itself; this keeps `--node-rank` and one restart loop for both.

Keys: `run_id`, `node/next` (arrival order), `node/K/{claim,host}`,
`attempt/N/{port,joined/K,report/K,failed,decision}`, `end` (the job was stopped or failed outside
an attempt; every node leaves) and `left/K` (a follower is done: the leader may close the store).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo
from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

from shoal.cluster import store as stores
from shoal.cluster.interface import local_addresses
from shoal.config import DEFAULT_PORT
from shoal.errors import ConfigError, WorkerError, first_line
from shoal.events import WorkerFailed

REPORT_SECONDS = 8.0  # how long the leader waits for every node's account of a failure


@dataclass
class Nodes:
    """Where this node stands in a multi-machine job (the command line's cluster arguments)."""

    count: int = 1
    rank: int | None = None
    endpoint: str | None = None
    run_id: str | None = None

    def address(self) -> tuple[str, int]:
        """The rendezvous endpoint as (host, port); a single machine uses 127.0.0.1 and a free port."""
        if self.endpoint is None:
            if self.count > 1:
                raise ConfigError("--rdzv-endpoint: HOST:PORT is required when --nnodes > 1")
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


def resolve(host: str) -> str:
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as error:
        raise ConfigError(f"--rdzv-endpoint: cannot resolve {host!r}: {error}") from None


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Meeting:
    """This node's membership of the job: its node rank, the hosts, and the attempts."""

    def __init__(self, nodes: Nodes, timeout: float):
        self.nodes, self.count, self.timeout = nodes, nodes.count, timeout
        self.host = socket.gethostname()
        self.endpoint_host, self.port = nodes.address()
        self.worker_store: dist.TCPStore | None = None  # the leader's store for attempt n's workers
        self.store, self.node_rank, self.bind = self._open()
        self.port = self.store.port  # the one picked when asked for any
        self.leader = self.node_rank == 0
        self.hosts = self._introduce()
        self.attempt = -1  # the latest attempt begun
        self.gone: set[int] = set()  # nodes known to have left without a word

    # ------------------------------------------------------------------ joining once

    def _open(self) -> tuple[stores.Bounded, int, str | None]:
        """Hold the store (the leader) or join it; returns (store, node rank, address the leader binds)."""
        nodes, host = self.nodes, self.endpoint_host
        deadline = time.monotonic() + self.timeout
        bind = self._bind_address()
        if bind is not None and nodes.rank in (None, 0):
            try:
                store = stores.Bounded(stores.serve(bind, self.port))
                store.set("run_id", nodes.run_id or "shoal")
                return store, 0, bind
            except (OSError, RuntimeError) as error:
                if nodes.rank == 0:
                    raise WorkerError(f"{self.host}: cannot listen on {host}:{self.port}: {first_line(error)}") \
                        from None
                # another node of this machine holds it: join as a follower
        if nodes.rank == 0:
            raise ConfigError(f"--rdzv-endpoint: {host} is not an address of this machine ({self.host}); "
                              "node 0 holds the job's store there")
        store = stores.connect(host, self.port, deadline, "the job's store")
        if stores.wait_for(store, ["run_id"], deadline):
            raise WorkerError(f"{host}:{self.port} answers but holds no shoal job")
        run_id = store.get("run_id").decode()
        if run_id != (nodes.run_id or "shoal"):
            raise ConfigError(f"--rdzv-id: {host}:{self.port} holds job {run_id!r}, not {nodes.run_id or 'shoal'!r}")
        rank = nodes.rank if nodes.rank is not None else store.add("node/next", 1)
        if rank >= self.count:
            raise ConfigError(f"--nnodes: {host}:{self.port} already has its {self.count} machines")
        return store, rank, None

    def _bind_address(self) -> str | None:
        """The address the leader's store listens on, or None when the endpoint is not on this machine."""
        if self.nodes.endpoint is None:
            return "127.0.0.1"
        address = resolve(self.endpoint_host)
        if ipaddress.ip_address(address).is_loopback:
            # a hostname that resolves to 127.0.1.1 here (stock Debian) and to this machine elsewhere
            return address if self.count == 1 or is_address(self.endpoint_host) else "0.0.0.0"
        return address if address in local_addresses() else None

    def _introduce(self) -> list[str]:
        """Claim the node rank and learn every node's host."""
        claim = f"{self.host} (pid {os.getpid()}, {uuid.uuid4().hex[:8]})"
        if self.store.compare_set(f"node/{self.node_rank}/claim", "", claim).decode() != claim:
            taken = self.store.get(f"node/{self.node_rank}/claim").decode()
            raise ConfigError(f"--node-rank: node {self.node_rank} is already taken by {taken}; give every machine "
                              "its own rank, or none to any")
        self.store.set(f"node/{self.node_rank}/host", self.host)
        keys = [f"node/{rank}/host" for rank in range(self.count)]
        missing = self._wait(keys, time.monotonic() + self.timeout)
        if missing:
            absent = ", ".join(key.split("/")[1] for key in missing)
            raise WorkerError(f"{self.host}: {self.count - len(missing)} of {self.count} machines joined "
                              f"{self.endpoint_host}:{self.port} within {self.timeout:g} s (missing node {absent})")
        return [value.decode() for value in self.store.multi_get(keys)]

    # ------------------------------------------------------------------ each attempt

    def begin(self, attempt: int) -> tuple[str, int]:
        """Every node joins attempt `attempt`; returns (address, port) of its workers' store."""
        prefix, self.attempt = f"attempt/{attempt}", attempt
        if self.leader:
            self.worker_store = None  # the last attempt's store closes
            self.worker_store = stores.serve(self.bind)
            self.store.set(f"{prefix}/port", str(self.worker_store.port))
        self.store.set(f"{prefix}/joined/{self.node_rank}", "1")
        missing = self._wait([f"{prefix}/port"] + [f"{prefix}/joined/{rank}" for rank in range(self.count)],
                             time.monotonic() + self.timeout)
        if missing:
            gone = [int(key.rsplit("/", 1)[1]) for key in missing if "/joined/" in key]
            self.gone.update(gone)
            names = ", ".join(f"{self.hosts[rank]} (node {rank})" for rank in gone) or self.hosts[0]
            raise WorkerError(f"{names} did not come back within {self.timeout:g} s (cluster.timeout)")
        port = int(self.store.get(f"{prefix}/port"))
        address = "127.0.0.1" if self.nodes.endpoint is None else self.endpoint_host
        return address, port

    def report(self, attempt: int, report: Report) -> None:
        self.store.set(f"attempt/{attempt}/report/{self.node_rank}", json.dumps(asdict(report)))
        if not report.succeeded:
            self.store.compare_set(f"attempt/{attempt}/failed", "", str(self.node_rank))

    def reports(self, attempt: int, seconds: float = REPORT_SECONDS) -> tuple[list[Report], list[int]]:
        """(the reports of attempt `attempt`, the nodes that sent none within `seconds`)."""
        keys = [f"attempt/{attempt}/report/{rank}" for rank in range(self.count)]
        missing = self._wait(keys, time.monotonic() + seconds, watch_end=False)
        sent = [key for key in keys if key not in missing]
        reports = [Report(**json.loads(value)) for value in self.store.multi_get(sent)] if sent else []
        absent = [int(key.rsplit("/", 1)[1]) for key in missing]
        self.gone.update(absent)
        return reports, absent

    def decide(self, attempt: int, decision: Decision) -> None:
        self.store.set(f"attempt/{attempt}/decision", json.dumps(asdict(decision)))

    def decision(self, attempt: int) -> Decision:
        """The leader's decision on a failed attempt (a follower waits for it)."""
        key = f"attempt/{attempt}/decision"
        if self._wait([key], time.monotonic() + 2 * REPORT_SECONDS + stores.REQUEST_SECONDS):
            raise WorkerError(f"{self.hosts[0]} (node 0) decided nothing after the failure")
        return Decision(**json.loads(self.store.get(key)))

    # ------------------------------------------------------------------ the whole job's end

    def end(self, message: str) -> None:
        """Every node leaves (a stop, or a failure outside an attempt); best effort."""
        with contextlib.suppress(*stores.STORE_ERRORS):  # the store already gone or out of reach
            self.store.compare_set("end", "", message)

    def leave(self) -> None:
        """A follower is done with the job's store: the leader may close it (best effort)."""
        with contextlib.suppress(*stores.STORE_ERRORS):
            self.store.set(f"left/{self.node_rank}", "1")

    def linger(self, seconds: float = REPORT_SECONDS) -> None:
        """The leader keeps the store up until every follower still there has read the decision or the end."""
        with contextlib.suppress(*stores.STORE_ERRORS):
            there = [rank for rank in range(1, self.count) if rank not in self.gone and
                     (self.attempt < 0 or self.store.check([f"attempt/{self.attempt}/joined/{rank}"]))]
            self._wait([f"left/{rank}" for rank in there], time.monotonic() + seconds, watch_end=False)

    def ended(self) -> str | None:
        return self.store.get("end").decode() if self.store.check(["end"]) else None

    def _wait(self, keys: list[str], deadline: float, watch_end: bool = True) -> list[str]:
        """Wait for `keys`; an `end` set meanwhile by any node raises it here."""
        while True:
            missing = stores.wait_for(self.store, keys, min(deadline, time.monotonic() + 1.0))
            if not missing or time.monotonic() >= deadline:
                return missing
            ended = self.ended() if watch_end else None
            if ended is not None:
                raise WorkerError(ended)

    def watcher_store(self) -> stores.Bounded:
        """A second connection, for the thread that watches an attempt while the agent uses the first."""
        address = self.bind if self.bind not in (None, "0.0.0.0") else self.endpoint_host
        return stores.connect(address, self.port, time.monotonic() + stores.REQUEST_SECONDS, "the job's store")

    def close(self) -> None:
        self.worker_store = None
        self.store = None


class AttemptRendezvous(RendezvousHandler):
    """torch's agent's view of one attempt: everything was agreed beforehand, so nothing waits here."""

    def __init__(self, meeting: Meeting, attempt: int, address: str, port: int):
        self.store = dist.HashStore()  # torch's agent asks none of it: see shoal.cluster.launch.NodeAgent
        self.rank, self.count = meeting.node_rank, meeting.count
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
