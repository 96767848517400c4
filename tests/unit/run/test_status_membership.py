"""`shoal status`, `shoal report` and the loggers on a job whose machines change (`--nnodes MIN:MAX`), from
events written by hand as the launcher (append_event: membership, worker_failed) and the coordinator (its
EventLog, the loggers its listeners) write them: three machines that lose host2 after epoch 1, and one
machine that host1 joins after epoch 2. A run without membership records shows what it showed before."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import time
from pathlib import Path

import pytest

from shoal.events import (
    Checkpoint,
    DataLoaded,
    EpochEnd,
    Event,
    EventLog,
    JobEnd,
    JobStart,
    Membership,
    Progress,
    SecondsSplit,
    WorkerEpoch,
    WorkerFailed,
    append_event,
    read_history,
)
from shoal.run.report import plot_workers, write_report
from shoal.run.status import machines_text, membership_lines, render, summarize
from shoal.train.loggers import Loggers
from shoal.train.loggers.to_csv import CSV_FILE, CsvLogger, columns
from tests.unit.run.test_status_report import finished  # noqa: F401  (a fixture: a fixed job with a restart)

ROWS = 3000
LAUNCHER = (Membership, WorkerFailed)  # written by the first machine's launcher, not the coordinator
LOST = "host2 was lost (its launcher stopped answering)"


def workers(hosts: list[str]) -> list[WorkerEpoch]:
    """One record per training worker (its host by rank), equal shares of the rows."""
    rows = ROWS // len(hosts)
    return [WorkerEpoch(rank=rank, host=host, rows=rows, seconds=2.0, steps_per_second=10.0 - rank, compute=1.2,
                        communication=0.5, data=0.3, rate=rows / 1.5, share=1 / len(hosts))
            for rank, host in enumerate(hosts)]


def epoch(number: int, hosts: list[str]) -> EpochEnd:
    return EpochEnd(epoch=number, step=10 * number, train_loss=1 / number, samples=ROWS, seconds=2.0,
                    samples_per_second=ROWS / 2.0, seconds_split=SecondsSplit(compute=1.2, communication=0.5,
                                                                              data=0.3),
                    workers=workers(hosts), balance="equal")


def machines(attempt: int, hosts: list[str], counts: list[int], reason: str, from_epoch: int = 0,
             left: tuple = (), joined: tuple = ()) -> Membership:
    size = sum(counts)
    return Membership(attempt=attempt, hosts=hosts, workers=counts, world_size=size, left=list(left),
                      joined=list(joined) if attempt else list(hosts), reason=reason, from_epoch=from_epoch,
                      shares=[ROWS // size] * size)


def start(hosts: list[str], epochs: int = 3) -> JobStart:
    return JobStart(job="elastic", config={"train": {"epochs": epochs}}, world_size=len(hosts), trainers=len(hosts),
                    hosts=hosts, algorithm="sync", steps_per_epoch=10, train_rows=ROWS)


def resumed(hosts: list[str], from_epoch: int, before: int) -> JobStart:
    return dataclasses.replace(start(hosts).resumed(), from_epoch=from_epoch, resharded_from=before)


def lost_host2() -> list[Event]:
    """host0, host1 and host2 train epoch 1; host2 stops answering in epoch 2; host0 and host1 go on from
    epoch 1's checkpoint, epochs 2 and 3."""
    three, two = ["host0", "host1", "host2"], ["host0", "host1"]
    return [
        machines(0, three, [1, 1, 1], "the first machines met"),
        start(three), DataLoaded(seconds=1.0, per_rank=[1.0] * 3), epoch(1, three),
        Checkpoint(epoch=1, path="checkpoints/epoch-1"),
        Progress(epoch=2, step=15, step_in_epoch=5, steps_per_epoch=10, loss=0.4),
        WorkerFailed(rank=2, host="host2", message="stopped answering"),
        machines(1, two, [1, 1], LOST, from_epoch=1, left=["host2"]),
        resumed(two, 1, 3), DataLoaded(seconds=1.0, per_rank=[1.0] * 2), epoch(2, two), epoch(3, two),
        JobEnd(status="completed", epochs=3, steps=30, seconds=6.0),
    ]


def host1_joins() -> list[Event]:
    """host0's two workers train epochs 1 and 2; host1 (one worker) joins and the three train epochs 3 and 4."""
    before, after = ["host0", "host0"], ["host0", "host0", "host1"]
    return [
        machines(0, ["host0"], [2], "the first machines met"),
        start(before, epochs=4), epoch(1, before), epoch(2, before), Checkpoint(epoch=2, path="checkpoints/epoch-2"),
        machines(1, ["host0", "host1"], [2, 1], "host1 joined", from_epoch=2, joined=["host1"]),
        resumed(after, 2, 2), epoch(3, after), epoch(4, after),
        JobEnd(status="completed", epochs=4, steps=40, seconds=8.0),
    ]


def record(run_dir: Path, events: list[Event], loggers: Loggers | None = None) -> Path:
    """Write `events` as a job does: the launcher's by append_event, the coordinator's through its EventLog
    with the loggers as its listener (a new log at each start, as each attempt's coordinator opens one)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = None
    for event in events:
        if isinstance(event, LAUNCHER):
            append_event(run_dir, event)
            continue
        if isinstance(event, JobStart):
            log = EventLog(run_dir, listeners=[loggers] if loggers is not None else [])
        log.write(event)
    if loggers is not None:
        loggers.close()
    return run_dir


def section(text: str, title: str) -> list[str]:
    """The lines of a report's section, up to the next one."""
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0].strip().splitlines()


# ---------------------------------------------------------------- shoal status


def test_status_shows_the_machines_lost_and_the_world_size_now(tmp_path):
    text = render(summarize(record(tmp_path / "run", lost_host2()))).splitlines()
    assert text[1:4] == [
        "job elastic  algorithm sync  world size 2  hosts host0, host1",
        f"machines host0, host1 (2 workers) after epoch 1: {LOST}",
        "epoch 3/3 done  step 30",
    ]
    assert "restarts 0  last failure: rank 2 (host2): stopped answering" in text


def test_a_change_of_machines_rewinds_the_position_to_its_checkpoint(tmp_path):
    """Between the membership record and the coordinator's job_resumed: the new machines, and the epoch under
    way when host2 was lost is gone."""
    events = lost_host2()
    cut = next(index for index, event in enumerate(events) if isinstance(event, Membership) and event.attempt == 1)
    losing = record(tmp_path / "losing", events[:cut])
    assert "epoch 2/3 under way  step 15" in render(summarize(losing))
    append_event(losing, events[cut])
    summary = summarize(losing, now=time.time())
    assert summary.state == "running" and (summary.world_size, summary.hosts) == (2, ["host0", "host1"])
    assert (summary.epoch, summary.step_in_epoch, summary.step) == (1, None, 10)
    assert "epoch 1/3 done  step 10" in render(summary)


def test_status_shows_a_machine_that_joined_and_each_machines_workers(tmp_path):
    summary = summarize(record(tmp_path / "run", host1_joins()))
    assert (summary.world_size, summary.hosts, summary.epoch) == (3, ["host0", "host1"], 4)
    lines = render(summary).splitlines()
    assert lines[1:3] == ["job elastic  algorithm sync  world size 3  hosts host0, host1",
                          "machines host0, host1 (3 workers: 2 + 1) after epoch 2: host1 joined"]


def test_many_changes_show_the_latest_and_a_count_of_the_others():
    history = [machines(0, ["host0", "host1"], [1, 1], "the first machines met")]
    for attempt in range(1, 7):
        hosts = ["host0", "host1"] if attempt % 2 == 0 else ["host0"]
        reason = "host1 joined" if attempt % 2 == 0 else "host1 was lost (its launcher stopped answering)"
        history.append(machines(attempt, hosts, [1] * len(hosts), reason, from_epoch=attempt))
    assert membership_lines(history) == [
        "machines 3 earlier changes (shoal report lists each)",
        "         host0, host1 (2 workers) after epoch 4: host1 joined",
        "         host0 (1 worker) after epoch 5: host1 was lost (its launcher stopped answering)",
        "         host0, host1 (2 workers) after epoch 6: host1 joined",
    ]
    assert len(membership_lines(history[:5])) == 4  # four changes: one line each
    assert membership_lines(history[:1]) == []  # the machines a job started on are no change
    assert machines_text(machines(1, ["host0"], [2], "host1 was lost", from_epoch=3)) == \
        "host0 (2 workers) after epoch 3: host1 was lost"


def test_a_run_without_membership_records_prints_as_before(finished):  # noqa: F811
    lines = render(summarize(finished, now=1_000_000.0)).splitlines()
    assert lines[1:] == [
        "job demo  algorithm averaging  world size 2  hosts host-0, host-1",
        "epoch 3/3 done  step 300",
        "train loss 0.4000  test (epoch 3) loss 0.3500  accuracy 0.9000  auc 0.9500",
        "291 samples/s  elapsed 48s",
        "workers  rank 0 (host-0) 43.0 steps/s",
        "         rank 1 (host-1) 36.0 steps/s  <- slowest",
        "restarts 1  last failure: rank 1 (host-1) exit code -9 (SIGKILL): killed by the kernel",
        "checkpoints 3  latest: epoch 3 checkpoints/epoch-3",
    ]
    text = write_report(finished).read_text()
    assert [line[3:] for line in text.splitlines() if line.startswith("## ")] == [
        "Job", "Epochs", "Restarts and failures", "Plots"]


def test_machines_that_never_changed_print_nothing_new(tmp_path):
    """A job of changing machines that kept its first ones reads as the same job without the record."""
    events = [*host1_joins()[1:5], JobEnd(status="completed", epochs=2, steps=20, seconds=4.0)]
    plain = summarize(record(tmp_path / "plain", events))
    elastic = summarize(record(tmp_path / "elastic", [host1_joins()[0], *events]))
    assert render(elastic).splitlines()[1:] == render(plain).splitlines()[1:]  # all but the run's folder
    assert "Machines over time" not in write_report(tmp_path / "elastic").read_text()


# ---------------------------------------------------------------- shoal report


def test_report_has_the_machines_over_time_and_a_workers_column(tmp_path):
    text = write_report(record(tmp_path / "run", host1_joins())).read_text()
    assert section(text, "Machines over time")[:4] == [
        "| attempt | from epoch | machines | workers | world size | left | joined | why |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        "| 0 | start | host0 | 2 | 2 | - | host0 | the first machines met |",
        "| 1 | 2 | host0, host1 | 2, 1 | 3 | - | host1 | host1 joined |",
    ]
    epochs = section(text, "Epochs")
    assert epochs[0].startswith("| epoch | workers | train loss |")
    assert [row.split("|")[2].strip() for row in epochs[2:6]] == ["2", "2", "3", "3"]
    assert "| world size | 3 (3 training) in the last attempt (see Machines over time) |" in text
    assert section(text, "Restarts and failures")[:1] == [
        "- machines changed: host0, host1 (3 workers: 2 + 1) after epoch 2: host1 joined; the checkpoint of 2 "
        "workers resharded onto 3"]


def test_report_of_a_lost_machine_lists_it_and_draws_each_worker_while_it_trained(tmp_path):
    run = record(tmp_path / "run", lost_host2())
    text = write_report(run).read_text()
    assert section(text, "Machines over time")[3] == f"| 1 | 1 | host0, host1 | 1, 1 | 2 | host2 | - | {LOST} |"
    assert section(text, "Restarts and failures")[:2] == [
        "- worker failed: rank 2 (host2): stopped answering",
        f"- machines changed: host0, host1 (2 workers) after epoch 1: {LOST}; the checkpoint of 3 workers "
        "resharded onto 2"]
    assert "| host2 | 2 | 667 | 33.3% | - |" in section(text, "Machines")  # no share in epoch 3
    lines = plot_workers(read_history(run).latest_epochs()).axes[0].get_lines()
    assert {line.get_label(): list(line.get_xdata()) for line in lines} == {
        "rank 0 (host0)": [1, 2, 3], "rank 1 (host1)": [1, 2, 3], "rank 2 (host2)": [1]}


def test_a_machine_out_for_some_epochs_leaves_a_gap_in_the_plots():
    three, two = ["host0", "host1", "host2"], ["host0", "host1"]
    figure = plot_workers([epoch(1, three), epoch(2, two), epoch(3, three)])
    paces = {line.get_label(): list(line.get_ydata()) for line in figure.axes[0].get_lines()}
    assert paces["rank 2 (host2)"][0] == 8.0 and math.isnan(paces["rank 2 (host2)"][1])
    assert paces["rank 0 (host0)"] == [10.0, 10.0, 10.0]
    for panel in figure.axes[1:]:  # each machine's rate and share
        (host2,) = [line for line in panel.get_lines() if line.get_label() == "host2"]
        assert list(host2.get_xdata()) == [1, 2, 3] and math.isnan(host2.get_ydata()[1])


# ---------------------------------------------------------------- loggers


def test_the_csv_file_has_each_epochs_world_size(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    record(run, lost_host2(), Loggers({"csv": CsvLogger(run, ())}, io.StringIO(), run))
    text = (run / CSV_FILE).read_text()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(row["epoch"], row["world_size"]) for row in rows] == [("1", "3"), ("2", "2"), ("3", "2")]
    assert text.splitlines()[0] == ",".join(columns(())) and columns(())[-1] == "world_size"


def test_a_csv_file_begun_without_the_column_goes_on_without_it(tmp_path):
    old_header = ",".join(columns(())[:-1])
    (tmp_path / CSV_FILE).write_text(f"{old_header}\n")
    logger = CsvLogger(tmp_path, ())
    for event in (start(["host0", "host1"]), epoch(1, ["host0", "host1"])):
        logger.write(event)
    logger.close()
    header, row = (tmp_path / CSV_FILE).read_text().splitlines()
    assert header == old_header and row.startswith("1,10,") and len(row.split(",")) == len(header.split(","))


def test_tensorboard_has_each_epochs_world_size_and_each_set_of_machines(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard package (shoal[tensorboard]) is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from shoal.train.loggers.to_tensorboard import TensorBoardLogger

    run = tmp_path / "run"
    run.mkdir()
    record(run, lost_host2(), Loggers({"tensorboard": TensorBoardLogger(run)}, io.StringIO(), run))
    board = EventAccumulator(str(run / "tensorboard"))
    board.Reload()
    assert [(s.step, s.value) for s in board.Scalars("cluster/world_size")] == [(1, 3.0), (2, 2.0), (3, 2.0)]
    texts = [(event.step, event.tensor_proto.string_val[0].decode())
             for event in board.Tensors("cluster/membership/text_summary")]
    assert texts == [(0, "attempt 0: host0, host1, host2 (3 workers) from the start: the first machines met"),
                     (1, f"attempt 1: host0, host1 (2 workers) after epoch 1: {LOST}")]


def test_mlflow_has_each_epochs_world_size_and_the_latest_machines(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the mlflow package (shoal[mlflow]) is not installed")
    from mlflow.tracking import MlflowClient

    from shoal.train.loggers.to_mlflow import FILE_STORE, PATIENCE, MlflowLogger

    for name, value in (PATIENCE | FILE_STORE).items():  # set here, so the process's environment is kept
        monkeypatch.setenv(name, value)
    run = tmp_path / "run"
    run.mkdir()
    logger = MlflowLogger(run, None, "elastic")
    record(run, lost_host2(), Loggers({"mlflow": logger}, io.StringIO(), run))
    client = MlflowClient(tracking_uri=logger.uri)
    sizes = client.get_metric_history(logger.run_id, "cluster/world_size")
    assert sorted((metric.step, metric.value) for metric in sizes) == [(1, 3.0), (2, 2.0), (3, 2.0)]
    tags = client.get_run(logger.run_id).data.tags
    assert tags["shoal.machines"] == f"attempt 1: host0, host1 (2 workers) after epoch 1: {LOST}"
