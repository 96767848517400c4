"""Liveness in the store: each worker's beats, who it heard last, and the verdict it leaves for the launcher.

Several Heartbeats share one torch HashStore here, as the workers of a job share its TCPStore.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch.distributed as dist

from shoal.cluster.env import DistInfo
from shoal.cluster.heartbeat import SILENT_KEY, Heartbeat, beat_key, liveness_store, silence
from shoal.cluster.inspector import TRAIN
from shoal.cluster.waits import WAITS

INTERVAL = 0.05


def freeze(beat: Heartbeat) -> None:
    """Stop a heartbeat as SIGSTOP, a frozen process or a cut link does: no more beats, and no word of leaving."""
    beat._stop.set()
    beat._thread.join(5)


def wait_for(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(INTERVAL / 5)


@pytest.fixture
def store():
    return dist.HashStore()


@pytest.fixture
def beating(store):
    """Heartbeats started by a test on one shared store, closed (and their threads ended) afterwards."""
    started = []

    def start(rank: int, world_size: int = 3, host: str = "box", **watch) -> Heartbeat:
        beat = Heartbeat(store, rank, world_size, f"{host}{rank}", interval=INTERVAL, **watch)
        started.append(beat)
        return beat

    yield start
    for beat in started:
        beat.close()
        beat._thread.join(5)


def test_a_heartbeat_publishes_its_rank_host_and_step_and_counts_up(store, beating):
    beat = beating(1)
    beat.beat(42)
    wait_for(lambda: json.loads(store.get(beat_key(1)))["step"] == 42)
    first = json.loads(store.get(beat_key(1)))
    assert first["rank"] == 1 and first["host"] == "box1"
    wait_for(lambda: json.loads(store.get(beat_key(1)))["count"] > first["count"])


def test_every_rank_is_heard_while_all_beat(beating):
    beats = [beating(rank) for rank in range(3)]
    wait_for(lambda: all(len(beat.heard) == 3 for beat in beats))
    assert beats[0].silent(gap=10 * INTERVAL) is None


def test_the_rank_that_stopped_beating_is_named_by_the_others(beating):
    beats = [beating(rank) for rank in range(3)]
    beats[2].beat(7)
    wait_for(lambda: all(len(beat.heard) == 3 for beat in beats))
    freeze(beats[2])  # stopped, wedged or cut off: its beat no longer changes
    time.sleep(12 * INTERVAL)
    quiet = beats[0].silent(gap=6 * INTERVAL)
    assert (quiet["rank"], quiet["host"], quiet["step"]) == (2, "box2", 7)
    assert beats[1].silent(gap=6 * INTERVAL)["rank"] == 2


def test_a_rank_never_heard_counts_as_silent_since_listening_began(beating):
    beat = beating(0, world_size=2)
    time.sleep(8 * INTERVAL)
    quiet = beat.silent(gap=4 * INTERVAL)
    assert quiet["rank"] == 1 and quiet["step"] is None


def test_nobody_is_silent_when_the_gap_is_not_reached(beating):
    beats = [beating(rank) for rank in range(2)]
    wait_for(lambda: all(len(beat.heard) == 2 for beat in beats))
    freeze(beats[1])
    assert beats[0].silent(gap=60) is None


def test_blame_leaves_the_first_verdict_in_the_store(store, beating):
    beats = [beating(rank) for rank in range(3)]
    wait_for(lambda: all(len(beat.heard) == 3 for beat in beats))
    freeze(beats[1])
    time.sleep(12 * INTERVAL)
    assert beats[0].blame(gap=6 * INTERVAL)["rank"] == 1
    store.set(beat_key(1), json.dumps({"rank": 1, "host": "box1", "step": 0, "count": 10**6}))
    freeze(beats[2])
    time.sleep(12 * INTERVAL)
    beats[0].blame(gap=6 * INTERVAL)  # a later verdict (rank 2 now quiet) does not replace the first
    assert json.loads(store.get(SILENT_KEY))["rank"] == 1


def test_a_single_worker_is_never_silent(beating):
    assert beating(0, world_size=1).silent(gap=0) is None


def test_a_heartbeat_stops_when_closed(store, beating):
    beat = beating(0, world_size=1)
    beat.close()
    beat._thread.join(5)
    count = json.loads(store.get(beat_key(0)))["count"]
    time.sleep(4 * INTERVAL)
    assert json.loads(store.get(beat_key(0)))["count"] == count and not beat.beating


def test_a_store_out_of_reach_does_not_end_the_thread(beating):
    class Unreachable(dist.HashStore):
        def set(self, key, value):
            raise RuntimeError("connection reset")

    beat = Heartbeat(dist.HashStore(), 0, 1, "box", interval=INTERVAL)
    beat.store = Unreachable()
    time.sleep(4 * INTERVAL)
    assert beat.beating
    beat.close()


def test_a_worker_alone_or_without_a_store_beats_into_a_private_one(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert isinstance(liveness_store(DistInfo(world_size=4)), dist.HashStore)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    assert isinstance(liveness_store(DistInfo()), dist.HashStore)  # alone: never contacted


def test_a_machine_cut_off_with_two_ranks_is_named(beating):
    beats = [beating(rank, world_size=4) for rank in range(4)]
    wait_for(lambda: all(len(beat.heard) == 4 for beat in beats))
    freeze(beats[2])
    freeze(beats[3])  # both ranks of the second machine fall silent together
    time.sleep(12 * INTERVAL)
    assert beats[0].silent(gap=6 * INTERVAL)["rank"] in (2, 3)


# ---------------------------------------------------------------- the watch: hung for cluster.stall_timeout

STALL = 12 * INTERVAL


@pytest.fixture
def watching(beating):
    """Heartbeats that keep watch with STALL, each noting what it was handed (its `on_stall` calls)."""
    handed: dict[int, list[dict]] = {}

    def start(rank: int, world_size: int = 3, stall: float = STALL, **given) -> Heartbeat:
        handed[rank] = []
        return beating(rank, world_size, stall_timeout=stall, on_stall=handed[rank].append, **given)

    start.handed = handed
    return start


def test_a_rank_silent_for_the_stall_timeout_is_recorded_and_handed_on_once(store, watching):
    beats = [watching(rank) for rank in range(3)]
    beats[2].beat(7)
    wait_for(lambda: all(len(beat.heard) == 3 for beat in beats))
    freeze(beats[2])  # SIGSTOP: its thread stops with it
    wait_for(lambda: watching.handed[0] and watching.handed[1])
    time.sleep(2 * STALL)
    assert [len(watching.handed[rank]) for rank in range(3)] == [1, 1, 0]  # once each; the frozen one says nothing
    verdict = watching.handed[0][0]
    assert (verdict["rank"], verdict["host"], verdict["step"]) == (2, "box2", 7)
    assert verdict["silent_for"] >= round(STALL, 1)  # (rounded to a tenth)
    assert watching.handed[1][0] == verdict == json.loads(store.get(SILENT_KEY))  # every judge names the same


def test_neither_a_busy_worker_nor_one_never_heard_is_taken_for_hung(watching):
    """Rank 1's step stands still (a long forward pass, a wait in a collective) but its thread beats on; rank 2
    never beats (at the start it may only be slow to begin: left to the collectives' timeout). A stall timeout
    of 20 beats: a loaded machine may delay a few, as the 5 s least of cluster.stall_timeout allows."""
    beats = [watching(rank, stall=20 * INTERVAL) for rank in range(2)]
    beats[1].beat(3)
    time.sleep(40 * INTERVAL)
    assert watching.handed == {0: [], 1: []} and beats[0].stalled() is None
    assert beats[0].silent(gap=20 * INTERVAL)["rank"] == 2  # after a collective timed out it is still named


def test_a_rank_that_says_it_leaves_is_not_taken_for_hung(store, watching):
    beats = [watching(rank, world_size=2) for rank in range(2)]
    wait_for(lambda: all(len(beat.heard) == 2 for beat in beats))
    beats[1].leave()  # its own error, or the job's end: it may be gone a moment later
    freeze(beats[1])
    assert json.loads(store.get(beat_key(1)))["leaving"] is True
    time.sleep(2 * STALL)
    assert watching.handed[0] == [] and beats[0].blame(gap=STALL) is None and not store.check([SILENT_KEY])


def test_a_closed_heartbeat_says_it_leaves(store, beating):
    beat = beating(0, world_size=1)
    beat.close()
    assert json.loads(store.get(beat_key(0)))["leaving"] is True


def test_a_worker_that_cannot_hear_the_store_blames_nobody(store, watching):
    """Cut off itself, it would otherwise take every other rank for hung."""
    beats = [watching(rank) for rank in range(3)]
    wait_for(lambda: all(len(beat.heard) == 3 for beat in beats))

    class Unreachable(dist.HashStore):
        def set(self, key, value):
            raise RuntimeError("connection reset")

    beats[0].store = Unreachable()
    freeze(beats[2])
    wait_for(lambda: watching.handed[1])  # rank 1 still hears the store: it names rank 2
    time.sleep(2 * STALL)
    assert watching.handed[0] == [] and beats[0].silent(gap=STALL) is None


def test_the_verdict_recorded_first_is_the_one_handed_on(store, watching):
    store.set(SILENT_KEY, json.dumps({"rank": 1, "host": "box1", "step": 4, "silent_for": 9.0}))
    beats = [watching(rank, world_size=3) for rank in range(3)]
    wait_for(lambda: all(len(beat.heard) == 3 for beat in beats))
    freeze(beats[2])
    wait_for(lambda: watching.handed[0])
    assert watching.handed[0] == [{"rank": 1, "host": "box1", "step": 4, "silent_for": 9.0}]


def test_without_a_stall_timeout_nobody_is_judged(store, beating):
    beats = [beating(rank, world_size=2) for rank in range(2)]
    wait_for(lambda: all(len(beat.heard) == 2 for beat in beats))
    freeze(beats[1])
    time.sleep(12 * INTERVAL)
    assert beats[0].stalled() is None and not store.check([SILENT_KEY])


def test_the_silence_reads_with_its_step_and_seconds():
    assert silence({"step": 67, "silent_for": 31.4}) == "stopped answering at step 67 (no heartbeat for 31 s)"
    assert silence({"step": None}) == "stopped answering before its first step"


def test_a_worker_on_its_way_out_does_not_act_on_a_stall(watching):
    """It leaves by its own error or the job's end: its exit must stay its own, not the hung peer's."""
    beats = [watching(rank) for rank in range(3)]
    wait_for(lambda: all(len(beat.heard) == 3 for beat in beats))
    beats[0].leave()
    freeze(beats[2])
    wait_for(lambda: watching.handed[1])
    time.sleep(STALL)
    assert watching.handed[0] == []


@pytest.mark.parametrize("value", ['{"rank": 1}', "[1]", "not json", '{"rank": 2, "host": "h", "step": 1, "count": 3}',
                                   '{"rank": 1, "host": "h", "step": "7", "count": 3}',
                                   '{"rank": 1, "host": "h", "step": 7, "count": 3, "phase": 1}',
                                   '{"rank": 1, "host": "h", "step": 7, "count": 3, "waiting": "40"}',
                                   '{"rank": 1, "host": "h", "step": 7, "count": 3, "busy": -1}',
                                   '{"rank": 1, "host": "h", "step": 7, "count": 3, "busy": NaN}'])
def test_a_beat_that_is_not_a_workers_is_never_heard_and_does_not_end_the_thread(store, beating, value):
    beat = beating(0, world_size=2)
    store.set(beat_key(1), value)
    time.sleep(4 * INTERVAL)
    assert beat.beating and beat.heard.keys() == {0} and beat.silent(gap=0, heard_only=True) is None


# ---------------------------------------------------------------- the watch: stuck while the others wait


@pytest.fixture
def deadlocked():
    """A training thread stuck outside any collective (blocked on an event no one sets, until the test ends)."""
    never = threading.Event()
    thread = threading.Thread(target=never.wait, name="stuck-training", daemon=True)
    thread.start()
    yield thread.ident
    never.set()
    thread.join(5)


@pytest.fixture
def in_a_collective():
    """This thread marked as waiting in a collective, as the Communicator marks it, until the test ends."""
    thread = WAITS.enter()
    yield thread
    WAITS.leave(thread)


def test_a_beat_says_what_its_training_thread_does(store, beating, in_a_collective, deadlocked):
    waiting = beating(0, world_size=2)  # watches this thread, which waits
    busy = beating(1, world_size=2, watched=deadlocked)
    busy.enter_phase(TRAIN)
    wait_for(lambda: json.loads(store.get(beat_key(1)))["busy"] >= 3 * INTERVAL)
    wait_for(lambda: json.loads(store.get(beat_key(0)))["waiting"] >= 3 * INTERVAL)
    first, second = (json.loads(store.get(beat_key(rank))) for rank in range(2))
    assert (second["phase"], second["waiting"]) == (TRAIN, None)
    assert (first["phase"], first["busy"]) == ("starting", None) and waiting.phase == "starting"


def test_a_rank_stuck_at_one_step_while_another_waits_is_recorded_and_handed_on(store, watching, in_a_collective,
                                                                               deadlocked):
    """Rank 1's training thread is deadlocked while its heartbeat beats on; rank 0 waits in a collective. Rank 0
    names rank 1 as stopped making progress; rank 1 (busy, not waiting) and rank 2 (not waiting) act on nothing."""
    beats = [watching(0), watching(1, watched=deadlocked), watching(2, watched=deadlocked)]
    beats[1].beat(7)
    beats[1].enter_phase(TRAIN)
    wait_for(lambda: watching.handed[0])
    assert watching.handed[1] == [] and watching.handed[2] == []
    verdict = watching.handed[0][0]
    assert (verdict["rank"], verdict["step"], verdict["phase"]) == (1, 7, TRAIN)
    assert verdict["busy_for"] >= round(STALL, 1) and verdict["waited_for"] >= round(STALL, 1)
    assert verdict == json.loads(store.get(SILENT_KEY))
    assert silence(verdict).startswith("stopped making progress at step 7 (busy outside the exchange for ")


def test_a_rank_evaluating_or_advancing_is_not_taken_for_stuck(store, watching, in_a_collective, deadlocked):
    """Rank 1 evaluates (its thread busy, long); rank 2 trains and its step advances: rank 0 waits for them in
    vain for many times the stall timeout, and names nobody. A stall timeout of 20 beats: a loaded machine may
    delay a few of rank 2's steps."""
    stall = 20 * INTERVAL
    beats = [watching(0, stall=stall), watching(1, stall=stall, watched=deadlocked),
             watching(2, stall=stall, watched=deadlocked)]
    beats[1].enter_phase("evaluating")
    beats[2].enter_phase(TRAIN)
    for step in range(int(3 * stall / INTERVAL)):
        beats[2].beat(step)
        time.sleep(INTERVAL)
    assert watching.handed == {0: [], 1: [], 2: []} and not store.check([SILENT_KEY])
