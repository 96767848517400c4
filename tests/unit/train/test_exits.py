"""Failures recorded by the workers themselves (torchrun, srun, mpirun): each leaves its exit in the store,
and rank 0 names the cause and records it. Driven with a HashStore, as the workers share a TCPStore."""

from __future__ import annotations

import json
import time

import pytest
import torch.distributed as dist

from shoal.cluster.env import DistInfo
from shoal.cluster.heartbeat import SILENT_KEY, beat_key
from shoal.events import read_events
from shoal.train.exits import WITHOUT_A_WORD, Exit, ExitBook, Recorder, cause, record_outcome, record_restart


@pytest.fixture
def store():
    return dist.HashStore()


def kinds(run_dir) -> list[str]:
    return [event["event"] for event in read_events(run_dir)]


def test_an_error_of_its_own_is_the_cause_before_a_peers_lost_connection(store):
    book = ExitBook(store, attempt=0, world_size=3)
    book.write(Exit.of_error(0, "a", "[gloo/pair.cc:534] Connection closed by peer"))
    book.write(Exit.of_error(2, "b", "loss is nan at epoch 2"))
    book.write(Exit(1, "a", signal="SIGTERM"))
    exits = book.read()
    assert exits[0].consequence and not exits[2].consequence
    failure = cause(book, exits)
    assert (failure.rank, failure.host, failure.message) == (2, "b", "loss is nan at epoch 2")


def test_a_worker_that_left_no_word_was_killed_and_its_host_comes_from_its_beat(store):
    store.set(beat_key(1), json.dumps({"rank": 1, "host": "node7", "step": 5, "count": 3}))
    book = ExitBook(store, attempt=0, world_size=2)
    book.write(Exit.of_error(0, "node1", "Connection reset by peer"))
    failure = cause(book, book.read())
    assert (failure.rank, failure.host, failure.message) == (1, "node7", WITHOUT_A_WORD)


def test_the_silent_worker_after_a_timeout_comes_first(store):
    store.set(SILENT_KEY, json.dumps({"rank": 3, "host": "node4", "step": 17}))
    book = ExitBook(store, attempt=0, world_size=4)
    book.write(Exit.of_error(0, "node1", "worker rank 3 on node4 stopped answering at step 17; rank 0 waited for it"))
    failure = cause(book, book.read())
    assert (failure.rank, failure.host) == (3, "node4") and "step 17" in failure.message


def test_every_worker_stopped_by_a_signal_is_an_interrupt(store, tmp_path):
    book = ExitBook(store, attempt=0, world_size=2)
    for rank in range(2):
        book.write(Exit(rank, "a", signal="SIGTERM"))
    assert cause(book, book.read()) is None
    record_outcome(tmp_path, book, book.read(), restarts_left=0, launcher="SLURM")
    end = list(read_events(tmp_path))[-1]
    assert end["status"] == "interrupted" and "SIGTERM" in end["message"] and "SLURM" in end["message"]


def test_the_outcome_is_recorded_once_and_the_end_only_without_restarts_left(store, tmp_path):
    book = ExitBook(store, attempt=0, world_size=2)
    book.write(Exit.of_error(1, "b", "boom"))
    record_outcome(tmp_path, book, book.read(), restarts_left=1, launcher="torchrun")
    record_outcome(tmp_path, book, book.read(), restarts_left=0, launcher="torchrun")  # claimed already
    assert kinds(tmp_path) == ["worker_failed"]
    other = ExitBook(store, attempt=1, world_size=2)
    other.write(Exit.of_error(1, "b", "boom again"))
    record_outcome(tmp_path, other, other.read(), restarts_left=0, launcher="torchrun")
    assert kinds(tmp_path) == ["worker_failed", "worker_failed", "job_end"]
    assert list(read_events(tmp_path))[-1]["status"] == "failed"


def test_a_restarted_rank_0_records_what_the_killed_one_could_not(store, tmp_path):
    ExitBook(store, attempt=0, world_size=2).write(Exit(1, "b", signal="SIGTERM"))  # rank 0 itself was killed
    record_restart(tmp_path, store, restarts=1, world_size=2, launcher="torchrun")
    events = list(read_events(tmp_path))
    assert [(event["event"], event.get("rank")) for event in events] == [("worker_failed", 0), ("job_restarted", None)]
    assert events[0]["message"] == WITHOUT_A_WORD and events[1]["restart"] == 1 and events[1]["from_epoch"] == 0


def test_the_waiting_ends_once_every_worker_left(store):
    book = ExitBook(store, attempt=0, world_size=2)
    book.write(Exit(0, "a", signal="SIGTERM"))
    book.write(Exit(1, "a", signal="SIGTERM"))
    began = time.monotonic()
    assert len(book.wait(seconds=30)) == 2
    assert time.monotonic() - began < 5  # at once, not after 30 s


def test_an_earlier_attempts_verdict_does_not_speak_for_this_one(store):
    store.set(SILENT_KEY, json.dumps({"rank": 1, "host": "old", "step": 3}))  # attempt 0's, in torchrun's store
    book = ExitBook(store, attempt=1, world_size=2)
    book.write(Exit(0, "a", signal="SIGTERM"))
    failure = cause(book, book.read())
    assert failure.message == WITHOUT_A_WORD and failure.host is None


def test_rank_0s_recorder_records_when_it_fails(store, tmp_path):
    info = DistInfo(rank=0, world_size=1, host="a", launcher="Open MPI")
    recorder = Recorder(store, info)
    recorder.started(tmp_path)
    recorder.failed("cannot read the dataset")
    assert kinds(tmp_path) == ["worker_failed", "job_end"]
