"""The stall inspector's rule, over beats as the workers send them: who is stuck, and who never is."""

from __future__ import annotations

from shoal.cluster.heartbeat import silence
from shoal.cluster.inspector import TRAIN, description, stuck

STALL = 30.0


def beat(rank: int, *, phase: str = TRAIN, waiting: float | None = None, busy: float | None = None,
         step: int = 67, **more) -> dict:
    """A beat as Heartbeat sends it: `waiting` seconds in a collective, or else `busy` seconds at `step`."""
    return {"rank": rank, "host": f"box{rank}", "step": step, "count": 9, "phase": phase, "waiting": waiting,
            "busy": busy if waiting is None else None, **more}


def test_a_rank_busy_at_one_step_while_another_waits_as_long_is_stuck():
    verdict = stuck({0: beat(0, waiting=31.0), 1: beat(1, busy=32.5)}, STALL)
    assert (verdict["rank"], verdict["host"], verdict["step"]) == (1, "box1", 67)
    assert (verdict["busy_for"], verdict["waited_for"]) == (32.5, 31.0)


def test_a_slow_rank_whose_step_advances_is_not_stuck():
    """Its busy seconds start again at every step: however long the others wait, it is not stuck."""
    assert stuck({0: beat(0, waiting=120.0), 1: beat(1, busy=4.0, step=900)}, STALL) is None


def test_a_rank_evaluating_checkpointing_or_loading_is_not_stuck():
    for phase in ("evaluating", "checkpointing", "loading", "finishing", "starting"):
        assert stuck({0: beat(0, phase=phase, busy=600.0), 1: beat(1, waiting=600.0)}, STALL) is None, phase


def test_nobody_is_stuck_while_everyone_waits():
    """All wait in collectives (for a rank lost otherwise, or a slow link): none of them is to blame."""
    assert stuck({rank: beat(rank, waiting=100.0) for rank in range(3)}, STALL) is None


def test_a_rank_never_heard_from_is_not_stuck():
    """Rank 2 sent no beat (it may be slow to start): the collectives' timeout, or silence, is for it."""
    assert stuck({0: beat(0, waiting=100.0), 1: beat(1, waiting=100.0)}, STALL) is None


def test_a_rank_is_not_stuck_unless_another_has_waited_as_long():
    assert stuck({0: beat(0, waiting=29.0), 1: beat(1, busy=500.0)}, STALL) is None
    assert stuck({0: beat(0, busy=500.0), 1: beat(1, busy=500.0)}, STALL) is None  # nobody waits for them


def test_a_rank_busy_for_less_than_the_stall_timeout_is_not_stuck():
    assert stuck({0: beat(0, waiting=100.0), 1: beat(1, busy=29.9)}, STALL) is None


def test_a_rank_that_says_it_leaves_is_neither_stuck_nor_waiting():
    assert stuck({0: beat(0, waiting=100.0), 1: beat(1, busy=100.0, leaving=True)}, STALL) is None
    assert stuck({0: beat(0, waiting=100.0, leaving=True), 1: beat(1, busy=100.0)}, STALL) is None


def test_the_rank_busy_longest_is_named_when_several_are():
    beats = {0: beat(0, waiting=50.0), 1: beat(1, busy=40.0), 2: beat(2, busy=45.0)}
    assert stuck(beats, STALL)["rank"] == 2


def test_a_beat_without_the_inspectors_figures_is_never_stuck():
    """A beat that does not say what its thread does (phase, waiting, busy) is not judged by them."""
    old = {"rank": 1, "host": "box1", "step": 3, "count": 4}
    assert stuck({0: beat(0, waiting=100.0), 1: old}, STALL) is None


def test_the_verdict_reads_as_stopped_making_progress_wherever_silence_is_read():
    verdict = stuck({0: beat(0, waiting=31.0), 1: beat(1, busy=31.4)}, STALL)
    expected = "stopped making progress at step 67 (busy outside the exchange for 31 s while the others waited)"
    assert description(verdict) == silence(verdict) == expected
