"""The stall inspector: the rank that still beats but stopped making progress while the others wait for it.

A worker that stops altogether falls silent, and its peers name it (shoal.cluster.heartbeat). One whose
training thread is deadlocked, in the user's code or on a lock, beats on from its heartbeat thread, so
silence never names it: the others would only wait in a collective until `cluster.timeout` ends it. As
Horovod's stall inspector names the ranks that have not joined a collective the others wait in, each beat
also says what the rank's training thread is doing, each figure measured by the rank on its own clock
(nothing compares two machines' clocks):

- `phase`: "train" inside the epoch's step loop (a server's: serving the epoch); another name while it
  sets up, loads or re-reads data, fetches a batch, ends an epoch, evaluates, checkpoints or finishes;
- `waiting`: the seconds it has waited in the wait it is in for the others (a collective, a message, the
  gradient exchange's thread: shoal.cluster.waits), or null;
- `busy`: otherwise, the seconds since its step, its phase or its last wait changed.

A rank is stuck (`stuck`) when its beats still come, its phase is "train", it does not wait, and it has
been busy at one step for `cluster.stall_timeout`, while another rank has waited in a collective for
`cluster.stall_timeout` too. A rank whose step keeps advancing (a slow machine), one evaluating,
checkpointing or loading data (rank 0's evaluation can be long), and one never heard from are never
stuck; nor is any rank while nobody waits for it. The waiting rank that finds it records it as the
attempt's verdict, as for silence, and leaves.

Limits: one step computed for `cluster.stall_timeout` or longer (or a callback of the user's that takes as
long inside the step loop) while another rank waits as long for it cannot be told from a deadlock: set
`cluster.stall_timeout` above the longest step. A rank stuck outside the step loop (while it evaluates,
checkpoints or loads data), or inside a collective itself, still waits for `cluster.timeout`.
"""

from __future__ import annotations

from collections.abc import Mapping

TRAIN = "train"
"""The phase of a rank inside the epoch's step loop: the only one in which it can be found stuck."""


def busy(beat: dict) -> float:
    """Seconds `beat`'s rank has been busy training at one step outside any wait (0: it waits, is in another
    phase, or says it is leaving)."""
    seconds = beat.get("busy")
    if beat.get("leaving") or beat.get("phase") != TRAIN or beat.get("waiting") is not None:
        return 0.0
    return float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else 0.0


def waiting(beat: dict) -> float:
    """Seconds `beat`'s rank has waited in its current wait for the others (0: it does not wait)."""
    seconds = beat.get("waiting")
    if beat.get("leaving") or not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return 0.0
    return float(seconds)


def stuck(beats: Mapping[int, dict], stall_timeout: float) -> dict | None:
    """Among `beats` (each rank's latest as heard, by rank; a rank never heard has none), the rank stuck (see
    the module) as its beat with `busy_for` (its seconds busy) and `waited_for` (the longest wait of another
    rank) added; the one busy longest when several are; None when none is."""
    found = sorted((beat for beat in beats.values() if busy(beat) >= stall_timeout), key=busy, reverse=True)
    for beat in found:
        waited = max((waiting(other) for rank, other in beats.items() if rank != beat["rank"]), default=0.0)
        if waited >= stall_timeout:
            return {**beat, "busy_for": busy(beat), "waited_for": waited}
    return None


def description(verdict: dict) -> str:
    """How a stuck rank's verdict reads in a message: `stopped making progress at step S (busy outside the
    exchange for N s while the others waited)`."""
    return (f"stopped making progress at step {verdict['step']} "
            f"(busy outside the exchange for {verdict['busy_for']:.0f} s while the others waited)")
