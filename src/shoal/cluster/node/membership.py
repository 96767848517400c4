"""Machines that leave and join a running job (`--nnodes MIN:MAX`): who is in each attempt.

A fixed job's machines all join every attempt (shoal.cluster.node.rendezvous.Meeting). Here each attempt
has its own members, chosen by the first machine (the leader, which holds the job's store and so cannot
leave): the machines of the last attempt that are still there, plus those that arrived meanwhile, up to
MAX. A machine that is lost gets `cluster.rejoin_timeout` to come back (as a new arrival: a machine that
starts again is a new node) before the others go on without it, if at least MIN remain. A machine that
starts while the job runs takes the next node rank and asks to join the next attempt; while the job
has room for it the leader then has the workers stop together at their next epoch's end with a
checkpoint (shoal.cluster.regroup), and attempt N starts with it, resuming from that checkpoint on the
new world size. Node ranks are never reused; the workers' ranks follow the members in node order, so the
leader's workers are always ranks 0.. and rank 0's checkpoint files stay where its events are.

torch's c10d rendezvous also admits MIN:MAX nodes, but it numbers nodes by their sorted addresses (rank 0,
the coordinator and the source of a resharded checkpoint, may land on a new machine with an empty run
directory), and its agent restarts every worker as soon as a node waits, mid-epoch, discarding the epoch.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable

from shoal.cluster import keys
from shoal.cluster import store as stores
from shoal.cluster.node.rendezvous import Meeting, Nodes
from shoal.errors import EXIT_USAGE, ConfigError, WorkerError, first_line

POLL_SECONDS = 0.2


class LeftJob(WorkerError):
    """This machine is out of a job that goes on without it (out of restarts, or left out): it leaves
    quietly, never ending the job for the others."""


class ElasticMeeting(Meeting):
    """A Meeting whose members change between attempts; the same interface for the supervisor."""

    def __init__(self, nodes: Nodes, timeout: float, workers: int = 1, rejoin_timeout: float = 60.0,
                 layout: Callable[[int], None] | None = None):
        """`layout`: training's checks of a job of that many workers in all (ConfigError): an arrival that the
        job could not take (the algorithm's groups, too few rows) is told why and let go; the job goes on."""
        self.minimum, self.rejoin_timeout, self.check = nodes.minimum, rejoin_timeout, layout
        self.dropped: set[int] = set()  # node ranks the leader let go: lost, or out of restarts
        self.previous: dict[int, str] = {}  # the node ranks and hosts of the attempt before
        super().__init__(nodes, timeout, workers)
        self.members, self.hosts, self.counts = [], [], []  # until the first attempt begins

    # ------------------------------------------------------------------ joining

    def _introduce(self) -> list[str]:
        """Claim the node rank and tell this machine's host and worker count; nobody waits for the others here."""
        self._claim()
        return []

    def _counts(self) -> list[int]:
        return []

    def first_attempt(self) -> int:
        """The attempt this machine can join: the first, or the one after the attempt running (an arrival)."""
        if self.leader or not self.store.check([keys.CURRENT]):
            return 0
        return int(self.store.get(keys.CURRENT)) + 1

    # ------------------------------------------------------------------ each attempt

    def begin(self, attempt: int) -> tuple[str, int]:
        """Join attempt `attempt` (an arrival left out waits for the next); returns its workers' store."""
        while True:
            self.attempt = attempt
            members = self._lead(attempt) if self.leader else self._follow(attempt)
            if self.node_rank in members:
                break
            if self.members:  # it was in the job: the leader let it go
                raise LeftJob(f"{self.host} (node {self.node_rank}) was left out of the job's attempt {attempt}")
            if self.store.check([keys.node(self.node_rank, "refused")]):
                refusal = LeftJob(f"{self.host} cannot join the job: "
                                  f"{self.store.get(keys.node(self.node_rank, 'refused')).decode()}")
                refusal.exit_code = EXIT_USAGE
                raise refusal
            attempt += 1  # arrived as the attempt's members were chosen
        self._take(members)
        port = int(self.store.get(keys.attempt(attempt, "port")))
        address = "127.0.0.1" if self.nodes.endpoint is None else self.endpoint_host
        return address, port

    def _lead(self, attempt: int) -> list[int]:
        self.worker_store = None  # the last attempt's store closes
        server = stores.serve(self.bind)
        self.worker_store = stores.Sealed(server, self.secret, self.worker_context(attempt))
        self.store.set(keys.attempt(attempt, "port"), str(server.port))
        self.store.set(keys.joined(attempt, self.node_rank), "1")
        members = self._gather(attempt)
        self.store.set(keys.attempt(attempt, "members"), json.dumps(members))
        self.store.set(keys.CURRENT, str(attempt))
        return members

    def _follow(self, attempt: int) -> list[int]:
        self.store.set(keys.joined(attempt, self.node_rank), "1")
        key = keys.attempt(attempt, "members")
        # an arrival waits for the running attempt's end (an epoch or more): bounded by the job's end
        wait = self.timeout + self.rejoin_timeout if self.members else float("inf")
        if self._wait([key], time.monotonic() + wait):
            raise WorkerError(f"the first machine ({self.endpoint_host}) did not start attempt {attempt} within "
                              f"{wait:g} s")
        return json.loads(self.store.get(key))

    def _gather(self, attempt: int) -> list[int]:
        """The leader: the members of `attempt`, once those of the last attempt still in it have joined and
        as many as before (MAX at the start) are there, or MIN are and `rejoin_timeout` has passed."""
        before = [rank for rank in self.members if rank not in self.dropped]
        began = time.monotonic()
        while True:
            joined = self._joined(attempt)
            arrivals = [rank for rank in joined if rank not in self.members]
            wanted = self.count if not self.members else min(self.count, len(self.members) + len(arrivals))
            present = all(rank in joined for rank in before)
            waited = time.monotonic() - began
            enough = len(joined) >= wanted or (len(joined) >= self.minimum and waited >= self.rejoin_timeout)
            if present and enough or (waited >= self.timeout and len(joined) >= self.minimum):
                kept = [rank for rank in joined if rank in before]
                return self._admit(kept, arrivals[:self.count - len(kept)])
            if waited >= max(self.timeout, self.rejoin_timeout):
                raise WorkerError(f"{len(joined)} of at least {self.minimum} machines joined "
                                  f"{self.endpoint_host}:{self.port} within {waited:.0f} s (--nnodes "
                                  f"{self.minimum}:{self.count}, cluster.rejoin_timeout)")
            time.sleep(POLL_SECONDS)
            self._raise_if_ended()

    def _admit(self, kept: list[int], taken: list[int]) -> list[int]:
        """The members: those kept and the arrivals taken, less the arrivals the job's checks refuse (from the
        last), which are let go with a line saying why."""
        while taken and self.check is not None:
            names = [keys.node(rank, "workers") for rank in kept + taken]
            try:
                self.check(sum(int(count) for count in self.store.multi_get(names)))
                break
            except ConfigError as error:
                refused = taken.pop()
                self.dropped.add(refused)
                reason = f"with it, {first_line(error)}"
                self.store.set(keys.node(refused, "refused"), reason)
                print(f"shoal: node {refused} cannot join: {reason}", file=sys.stderr, flush=True)
        return sorted(kept + taken)

    def _joined(self, attempt: int, store: stores.Sealed | None = None) -> list[int]:
        """The node ranks that joined `attempt` so far (asked on `store`, default this meeting's), leaving out
        those let go."""
        store = store or self.store
        last = int(store.add(keys.NEXT_NODE, 0))
        names = [keys.joined(attempt, rank) for rank in range(last + 1) if rank not in self.dropped]
        joined = [keys.node_of(name) for name in names if store.check([name])]
        return [rank for rank in joined if not store.check([keys.left(rank)])]  # a machine taken out meanwhile

    def _take(self, members: list[int]) -> None:
        """The attempt's members, hosts and worker counts, in node order."""
        self.previous = dict(zip(self.members, self.hosts))
        names = [keys.node(rank, field) for rank in members for field in ("host", "workers")]
        values = [value.decode() for value in self.store.multi_get(names)]
        self.members, self.hosts, self.counts = members, values[0::2], [int(count) for count in values[1::2]]
        self.gone.difference_update(members)

    def arrivals(self, attempt: int, store: stores.Sealed | None = None) -> bool:
        """Whether machines wait to join attempt `attempt` (the leader asks while the one before runs, on a
        connection of its watch's, `store`), the job having room for them."""
        if len(self.members) >= self.count:
            return False
        return any(rank not in self.members for rank in self._joined(attempt, store))

    def waiting(self) -> list[int]:
        """Arrivals waiting for the next attempt: the leader stays until they have read the job's end."""
        return [rank for rank in self._joined(self.attempt + 1) if rank not in self.members] if self.leader else []

    def say_leaving(self, signal_name: str) -> None:
        """This machine was taken out (Ctrl-C, SIGTERM): the leader records it as having left, not as lost."""
        with contextlib.suppress(*stores.STORE_ERRORS):
            self.store.set(keys.node(self.node_rank, "leaving"), signal_name)

    def leaving(self, node_rank: int) -> str | None:
        """`left (SIGTERM on its machine)` for a node that said it leaves; None for one that said nothing."""
        with contextlib.suppress(*stores.STORE_ERRORS):
            if self.store.check([keys.node(node_rank, "leaving")]):
                return f"left ({self.store.get(keys.node(node_rank, 'leaving')).decode()} on its machine)"
        return None

    def drop(self, node_ranks: list[int]) -> None:
        """The leader lets these nodes go: the next attempt neither waits for them nor takes them back."""
        self.dropped.update(node_ranks)
        self.gone.update(node_ranks)

    def changes(self) -> tuple[list[str], list[str]]:
        """The hosts that left and those that joined since the attempt before (told apart by node rank: two
        machines may share a name)."""
        left = [host for rank, host in self.previous.items() if rank not in self.members]
        joined = [host for rank, host in zip(self.members, self.hosts) if rank not in self.previous]
        return left, joined

    def _raise_if_ended(self) -> None:
        ended = self.ended()
        if ended is not None:
            raise WorkerError(ended)
