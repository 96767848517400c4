"""Every key of the job's store, in one place: what the store holds, and who writes each key.

The launchers (shoal.cluster.node.rendezvous) and the workers (heartbeats, exits, device agreement,
torchrun's attempt count) share one store per job; spelling each name once keeps their keys apart
and shows the whole key space at a glance. All are sealed by the job's secret (shoal.cluster.store.
Sealed) except `PUBLIC`.

The launchers' store: `instance`, `hello/next`, `hello/N`, `welcome/N` (greeting), `node/next` (arrival
order), `node/K/{claim,streamed,host,workers,alive,refused,leaving}` (streamed: "1" when a fixed job's machine
lacks a dataset of the job's, set with its claim; alive: counted up by the launcher's watch while its workers run;
refused: why an arrival cannot join), `attempt/N/{port,joined/K,report/K,failed,decision}`, `end`
(the job was stopped or failed outside an attempt; every node leaves) and `left/K` (a follower is done: the
leader may close the store). A job whose machines may change (--nnodes MIN:MAX) adds `attempt/N/members` (the
node ranks in attempt N, set by the leader) and `attempt/current` (the attempt running). `data/port` is where
the first machine serves the job's datasets ("": it serves none), set once the machines met, before any worker
starts: a server only when another machine's `streamed` asked for one, or machines may change.

The workers' store: `shoal/beat/R` and `shoal/silent` (liveness), `shoal/exit/N/R` and
`shoal/exit/N/recorded` (ways out, under other launchers), `shoal/regroup` (the leader: machines wait to
join, stop at the next epoch's end) and `shoal/regrouped` (rank 0: stopped for them, with a checkpoint),
`shoal/device/R` and `shoal/device/read/R` (device agreement), `shoal/started/R` and the prefix
`shoal/attempt-N` (torchrun's restarts).
"""

from __future__ import annotations

PUBLIC = "shoal"
"""The one key outside the secret's names: a shoal job holds this store."""
INSTANCE = "instance"
"""Set by the leader of a job with this secret (a machine with another secret finds none); the job's
instance itself is told by shoal.cluster.node.greeting (`hello/N`, `welcome/N`)."""
NEXT_NODE = "node/next"
END = "end"
SILENT = "shoal/silent"
CURRENT = "attempt/current"
DATA_PORT = "data/port"
REGROUP = "shoal/regroup"
REGROUPED = "shoal/regrouped"
PROCESS_GROUP = "process group"
"""The secret's name for the prefix of torch's own process-group keys."""


def node(rank: int, field: str) -> str:
    """`claim`, `streamed`, `host`, `workers`, `alive`, `refused` or `leaving` of node `rank`."""
    return f"node/{rank}/{field}"


def attempt(number: int, field: str) -> str:
    """`port`, `failed`, `decision` or `members` of attempt `number`."""
    return f"attempt/{number}/{field}"


def joined(number: int, node_rank: int) -> str:
    return f"attempt/{number}/joined/{node_rank}"


def report(number: int, node_rank: int) -> str:
    return f"attempt/{number}/report/{node_rank}"


def left(node_rank: int) -> str:
    return f"left/{node_rank}"


def node_of(key: str) -> int:
    """The node a `joined`, `report` or `left` key names."""
    return int(key.rsplit("/", 1)[1])


def beat(rank: int) -> str:
    return f"shoal/beat/{rank}"


def exit_of(number: int, rank: int | str) -> str:
    """Worker `rank`'s way out of attempt `number` ("recorded": who records the attempt's outcome)."""
    return f"shoal/exit/{number}/{rank}"


def device(rank: int) -> str:
    return f"shoal/device/{rank}"


def device_read(rank: int) -> str:
    return f"shoal/device/read/{rank}"


def started(rank: int) -> str:
    return f"shoal/started/{rank}"


def attempt_prefix(number: int) -> str:
    return f"shoal/attempt-{number}"
