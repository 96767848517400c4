"""The root cause of a failed attempt, from what every rank and node reported: one order for every launcher.

After one worker fails, the others fail too (a lost peer, a collective that timed out, stopped by
their launcher), so most of what is reported is a consequence. shoal's launcher names the cause
for one node's workers (from torch's failure records) and then, on the leader, for the whole job
(from every node's report and the workers' liveness); under torchrun, srun or mpirun, rank 0 names
it from the exits the workers left in the store. All three translate what they saw into accounts
and ask `root_cause`, so the same failure is named the same way whoever launched the workers.

Order of precedence, first wins:

1. SILENT: a worker found silent by the liveness (shoal.cluster.heartbeat): without a heartbeat for
   `cluster.stall_timeout`, or when a collective timed out. It went quiet before the others gave up
   waiting, and a worker that raises says it is leaving and beats on while it tears down, so silence
   is the earliest sign of all.
2. RAISED: a worker's own error (one that does not only say a peer went away).
3. KILLED: a worker or node that ended without a word: killed by a signal its launcher did not send
   (SIGKILL, the out-of-memory killer, a crash), a worker that left no exit, a node whose launcher
   sent no report.
4. FOLLOWED: anything else that failed: an error that only followed a peer's loss, a worker stopped
   by its launcher (SIGTERM), an exit status without an error.

Among accounts of one kind the first given wins: callers list them earliest first where they know
when (torch's failure records), else by rank or node.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.IntEnum):
    """How an account's worker or node ended, in order of precedence (lowest wins)."""

    SILENT = 1
    RAISED = 2
    KILLED = 3
    FOLLOWED = 4


@dataclass(frozen=True)
class Account:
    """What one rank or node reported about how its attempt ended."""

    kind: Kind
    rank: int | None = None
    host: str | None = None
    message: str | None = None
    node: int | None = None
    """The node (shoal's launcher), for a node that sent no report."""
    details: object = None
    """What the caller translated this account from (torch's failure record, a node's report), handed back."""


def root_cause(accounts: list[Account]) -> Account | None:
    """The account to blame (see the module's order of precedence), or None when there is none."""
    return min(accounts, key=lambda account: account.kind, default=None)  # min keeps the first of equals
