"""The events file stays strict JSON, one record a line: NaN metrics, and a line torn by a writer that died."""

from __future__ import annotations

import json
import math

import numpy

from shoal.events import (
    EVENTS_FILE,
    Checkpoint,
    EpochEnd,
    EventLog,
    JobEnd,
    SecondsSplit,
    Validation,
    WorkerEpoch,
    append_event,
    read_events,
    read_history,
)


def strict(line: str) -> dict:
    """One line as JSON, refusing the NaN and Infinity that Python's json would accept."""
    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


def lines(run_dir) -> list[str]:
    text = (run_dir / EVENTS_FILE).read_text()
    assert text.endswith("\n")
    return text.splitlines()


def test_non_finite_metrics_are_written_as_null_and_read_back_as_nan(tmp_path):
    nan, inf = float("nan"), float("inf")
    append_event(tmp_path, EpochEnd(epoch=1, train_loss=nan, test={"loss": nan, "accuracy": 0.5, "auc": -inf},
                                    seconds_split=SecondsSplit(compute=inf),
                                    workers=[WorkerEpoch(rank=0, seconds=nan)]))
    append_event(tmp_path, Validation(count=3, test={"loss": numpy.float32("nan"), "accuracy": numpy.float64(inf)}))
    append_event(tmp_path, JobEnd(status="completed", test={"loss": nan}, seconds=inf))

    records = [strict(line) for line in lines(tmp_path)]
    assert records[0]["train_loss"] is None and records[0]["test"] == {"loss": None, "accuracy": 0.5, "auc": None}
    assert records[0]["seconds_split"]["compute"] is None and records[0]["workers"][0]["seconds"] is None
    assert records[1]["test"] == {"loss": None, "accuracy": None}
    assert records[2]["test"] == {"loss": None} and records[2]["seconds"] is None

    history = read_history(tmp_path)
    epoch = history.epochs[0]
    assert math.isnan(epoch.train_loss) and math.isnan(epoch.test["loss"]) and epoch.test["accuracy"] == 0.5
    assert math.isnan(epoch.seconds_split.compute) and math.isnan(epoch.workers[0].seconds)
    assert math.isnan(history.end.test["loss"]) and math.isnan(history.end.seconds)


def test_an_append_after_a_torn_last_line_starts_on_its_own_line(tmp_path):
    append_event(tmp_path, Checkpoint(epoch=1, path="checkpoints/epoch-1"))
    with open(tmp_path / EVENTS_FILE, "a") as handle:
        handle.write('{"event": "epoch_end", "epoch": 2, "train_lo')  # a writer killed mid-record
    assert [record["epoch"] for record in read_events(tmp_path)] == [1]  # the reader skips it meanwhile

    append_event(tmp_path, JobEnd(status="failed", message="worker 1 was killed"))

    records = [strict(line) for line in lines(tmp_path)]
    assert [record["event"] for record in records] == ["checkpoint", "job_end"]
    assert read_history(tmp_path).end.message == "worker 1 was killed"


def test_a_file_holding_only_a_torn_line_is_emptied_before_the_first_record(tmp_path):
    (tmp_path / EVENTS_FILE).write_bytes(b'{"event": "job_st')
    append_event(tmp_path, Checkpoint(epoch=1, path="p"))
    assert [strict(line)["event"] for line in lines(tmp_path)] == ["checkpoint"]


def test_a_log_open_for_the_whole_job_cuts_a_line_torn_by_another_writer(tmp_path):
    log = EventLog(tmp_path)  # as the coordinator holds it
    try:
        log.write(Checkpoint(epoch=1, path="a"))
        long_torn = '{"event": "progress", "message": "' + "x" * 200_000  # longer than one read of the tail
        with open(tmp_path / EVENTS_FILE, "a") as handle:
            handle.write(long_torn)
        log.write(Checkpoint(epoch=2, path="b"))
    finally:
        log.close()
    assert [strict(line)["epoch"] for line in lines(tmp_path)] == [1, 2]
