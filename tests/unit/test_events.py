"""The event stream's schema: every kind round-trips through the file, the stored format stays as
readers of older runs expect, and a run's history answers its readers' questions."""

from __future__ import annotations

import json
import threading

import pytest

from shoal.errors import ShoalError
from shoal.events import (
    EVENTS_FILE,
    KINDS,
    Checkpoint,
    DataLoaded,
    EpochEnd,
    EventLog,
    JobEnd,
    JobRestarted,
    JobResumed,
    JobStart,
    Membership,
    Progress,
    SecondsSplit,
    Validation,
    WorkerEpoch,
    WorkerFailed,
    WorkerMemory,
    append_event,
    parse,
    read_events,
    read_history,
)

START = JobStart(from_epoch=0, versions={"shoal": "0.1.0"}, job="demo", config={"train": {"epochs": 3}},
                 world_size=2, trainers=2, hosts=["a", "b"], threads=1, device="cpu", algorithm="sync",
                 train_rows=100, test_rows=10, steps_per_epoch=5, parameters=42)


def epoch(number: int, seconds: float = 2.0, algorithm: dict | None = None) -> EpochEnd:
    return EpochEnd(epoch=number, step=5 * number, train_loss=0.5 / number, test={"loss": 0.4}, samples=100,
                    seconds=seconds, samples_per_second=100 / seconds,
                    seconds_split=SecondsSplit(compute=1.0, communication=0.5, data=0.25, evaluation=0.25),
                    workers=[WorkerEpoch(rank=rank, host="ab"[rank], rows=50, seconds=seconds, steps_per_second=2.5,
                                         compute=1.0, communication=0.5, data=0.25) for rank in range(2)],
                    algorithm=algorithm)


ONE_OF_EACH = [
    START,
    DataLoaded(seconds=1.5, per_rank=[1.5, 1.0], shares=[{"mode": "memory"}, {"mode": "memory"}]),
    Progress(epoch=1, step=3, step_in_epoch=3, steps_per_epoch=5, loss=0.7),
    epoch(1, algorithm={"updates": 10, "staleness": {"mean": 0.5, "max": 1}}),
    Checkpoint(epoch=1, path="checkpoints/epoch-1", seconds=0.1),
    Validation(count=20, test={"loss": 0.45, "accuracy": 0.8}, seconds=0.2),
    WorkerFailed(rank=1, host="b", exit_code=-9, signal="SIGKILL", message="killed by SIGKILL"),
    JobRestarted(restart=1, from_epoch=1, epochs_redone=1),
    Membership(attempt=1, hosts=["host0", "host1"], workers=[2, 1], world_size=3, left=["host2"], joined=[],
               reason="host2 was lost (its launcher stopped answering)", from_epoch=1, shares=[334, 333, 333]),
    START.resumed(),
    JobEnd(status="completed", test={"loss": 0.3}, seconds=9.5, epochs=3, steps=15, model="model.pt",
           memory=[WorkerMemory(before_data=1000, peak=3000), WorkerMemory(before_data=1100, peak=2900)]),
]


def test_the_examples_cover_every_kind():
    assert {type(event) for event in ONE_OF_EACH} == set(KINDS.values())


def test_every_kind_reads_back_as_written(tmp_path):
    log = EventLog(tmp_path)
    written = [log.write(event) for event in ONE_OF_EACH]
    log.close()
    assert all(event.time > 0 for event in written)
    assert read_history(tmp_path).events == written


def test_the_stored_record_is_the_kind_the_time_then_the_fields(tmp_path):
    append_event(tmp_path, epoch(2))
    (record,) = read_events(tmp_path)
    assert list(record)[:4] == ["event", "time", "epoch", "step"]
    assert record["event"] == "epoch_end" and record["epoch"] == 2
    assert record["seconds_split"] == {"compute": 1.0, "communication": 0.5, "data": 0.25, "evaluation": 0.25}
    assert record["workers"][1] == {"rank": 1, "host": "b", "rows": 50, "seconds": 2.0, "steps_per_second": 2.5,
                                    "compute": 1.0, "communication": 0.5, "data": 0.25, "rate": 0.0, "share": 0.0}


def test_fields_not_known_are_left_out_of_the_stored_record(tmp_path):
    append_event(tmp_path, WorkerFailed(message="worker 0 failed"))
    append_event(tmp_path, JobEnd(status="interrupted", message="Ctrl-C"))
    append_event(tmp_path, epoch(1))  # a collective algorithm has no report of its own
    failed, ended, epoch_end = read_events(tmp_path)
    assert set(failed) == {"event", "time", "message"}
    assert set(ended) == {"event", "time", "status", "message"}
    assert "algorithm" not in epoch_end


def test_numpy_numbers_are_stored_as_plain_json(tmp_path):
    numpy = pytest.importorskip("numpy")
    append_event(tmp_path, Checkpoint(epoch=numpy.int64(3), path="p", seconds=numpy.float32(0.5)))
    line = (tmp_path / EVENTS_FILE).read_text()
    assert json.loads(line)["epoch"] == 3 and json.loads(line)["seconds"] == 0.5


def test_unknown_kinds_and_fields_are_ignored_and_missing_fields_take_defaults():
    assert parse({"event": "from_a_newer_shoal", "time": 1.0}) is None
    assert parse({"time": 1.0}) is None and parse({"event": ["job_end"]}) is None
    failed = parse({"event": "worker_failed", "time": 2.0, "message": "boom", "added_later": [1, 2]})
    assert failed == WorkerFailed(time=2.0, message="boom")
    assert failed.text() == "a worker: boom"  # nothing it lacks is shown as "?"
    ended = parse({"event": "epoch_end", "epoch": 4, "seconds_split": {"compute": 2.0}, "workers": [{"rank": 3}]})
    assert ended.seconds_split == SecondsSplit(compute=2.0) and ended.workers == [WorkerEpoch(rank=3)]
    assert ended.test == {} and ended.algorithm is None


def test_a_half_written_last_line_is_skipped(tmp_path):
    append_event(tmp_path, START)
    with open(tmp_path / EVENTS_FILE, "a") as handle:
        handle.write('{"event": "epoch_end", "epo')
    assert [type(event) for event in read_history(tmp_path).events] == [JobStart]


def test_a_folder_without_events_is_not_a_run(tmp_path):
    with pytest.raises(ShoalError, match="no events.jsonl: not a shoal run directory"):
        read_history(tmp_path)


def test_history_keeps_the_last_attempt_of_a_redone_epoch(tmp_path):
    for event in (START, epoch(1, 2.0), epoch(2, 3.0), JobRestarted(restart=1, from_epoch=1), START.resumed(),
                  epoch(2, 4.0), epoch(3, 5.0)):
        append_event(tmp_path, event)
    history = read_history(tmp_path)
    assert [e.seconds for e in history.epochs] == [2.0, 3.0, 4.0, 5.0]
    assert [e.seconds for e in history.latest_epochs()] == [2.0, 4.0, 5.0]
    assert history.reached_epoch() == 3
    assert history.started() and history.end is None


def test_history_start_is_the_latest_details_and_kinds_match_exactly(tmp_path):
    append_event(tmp_path, START)
    append_event(tmp_path, JobResumed(from_epoch=2))  # a bare record (no details) does not replace them
    append_event(tmp_path, JobStart(**{**vars(START), "world_size": 3}).resumed())
    history = read_history(tmp_path)
    assert isinstance(history.start, JobResumed) and history.start.world_size == 3
    assert len(history.of(JobStart)) == 1 and len(history.of(JobResumed)) == 2
    assert history.start.configured_epochs() == 3


def test_a_background_writer_and_the_main_one_never_interleave(tmp_path):
    log = EventLog(tmp_path)

    def write_many():
        for count in range(200):
            log.write(Validation(count=count, test={"loss": 0.1}))

    thread = threading.Thread(target=write_many)
    thread.start()
    for number in range(1, 201):
        log.write(Progress(epoch=1, step=number))
    thread.join()
    log.close()
    events = read_history(tmp_path).events
    assert len(events) == 400 and len(list(read_events(tmp_path))) == 400


def test_the_newest_record_of_any_kind_dates_the_history(tmp_path):
    append_event(tmp_path, START)
    with open(tmp_path / EVENTS_FILE, "a") as handle:
        handle.write(json.dumps({"event": "from_a_newer_shoal", "time": 4_000_000_000.0}) + "\n")
    history = read_history(tmp_path)
    assert len(history.events) == 1 and history.last_time == 4_000_000_000.0
