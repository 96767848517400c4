"""Liveness in the store: each worker's beats, who it heard last, and the verdict it leaves for the launcher.

Several Heartbeats share one torch HashStore here, as the workers of a job share its TCPStore.
"""

from __future__ import annotations

import json
import time

import pytest
import torch.distributed as dist

from shoal.cluster.env import DistInfo
from shoal.cluster.heartbeat import SILENT_KEY, Heartbeat, beat_key, liveness_store

INTERVAL = 0.05


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

    def start(rank: int, world_size: int = 3, host: str = "box") -> Heartbeat:
        beat = Heartbeat(store, rank, world_size, f"{host}{rank}", interval=INTERVAL)
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
    beats[2].close()  # stopped, wedged or cut off: its beat no longer changes
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
    beats[1].close()
    assert beats[0].silent(gap=60) is None


def test_blame_leaves_the_first_verdict_in_the_store(store, beating):
    beats = [beating(rank) for rank in range(3)]
    wait_for(lambda: all(len(beat.heard) == 3 for beat in beats))
    beats[1].close()
    time.sleep(12 * INTERVAL)
    assert beats[0].blame(gap=6 * INTERVAL)["rank"] == 1
    store.set(beat_key(1), json.dumps({"rank": 1, "host": "box1", "step": 0, "count": 10**6}))
    beats[2].close()
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
    beats[2].close()
    beats[3].close()  # both ranks of the second machine fall silent together
    time.sleep(12 * INTERVAL)
    assert beats[0].silent(gap=6 * INTERVAL)["rank"] in (2, 3)
