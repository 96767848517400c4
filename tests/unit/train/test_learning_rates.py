"""Each param group's learning rate at every epoch: in epoch_end, and as `lr` / `lr/group0`... in the loggers.

The rate recorded is the one the epoch trained with (as it began), not the one the schedule moved it to at the
epoch's end; a job in process (a world of one) with two groups and StepLR checks it, a resumed job included.
The loggers are fed records by hand and read back with their own readers.
"""

from __future__ import annotations

import csv
import io

import pytest

from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.events import EpochEnd, EventLog, parse, read_history
from shoal.train.loggers.scalars import scalars
from shoal.train.loggers.to_csv import CSV_FILE, CsvLogger
from shoal.train.runner import Runner
from tests.unit.train.test_runner import job

RATE, BIAS_RATE, GAMMA = 0.01, 0.004, 0.5
EXPECTED = [[BIAS_RATE * GAMMA**epoch, RATE * GAMMA**epoch] for epoch in range(3)]
"""The biases' group first (the listed group), the rest after; halved after every epoch."""


def two_groups(tmp_path, epochs: int):
    config = job(tmp_path, epochs=epochs, optimizer={"name": "adam", "lr": RATE,
                                                      "param_groups": [{"params": "bias$", "lr": BIAS_RATE}]},
                 scheduler={"name": "StepLR", "step_size": 1, "gamma": GAMMA})
    config.output.loggers = ["csv"]
    return config


def csv_rows(run_dir) -> list[dict]:
    return list(csv.DictReader(io.StringIO((run_dir / CSV_FILE).read_text())))


def test_each_epoch_records_the_rates_it_trained_with_in_events_and_csv(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for epochs, resume in ((2, False), (3, True)):  # the third epoch's rates come from the checkpoint
        Runner(two_groups(tmp_path, epochs), DistInfo(), run_dir, threads=1, resume=resume,
               comm=Communicator(0, 1)).run()
    epochs = read_history(run_dir).epochs
    assert [epoch.epoch for epoch in epochs] == [1, 2, 3]
    for epoch, expected in zip(epochs, EXPECTED):
        assert epoch.learning_rates == pytest.approx(expected)
    rows = csv_rows(run_dir)
    assert [[float(row["lr.group0"]), float(row["lr.group1"])] for row in rows] == [e.learning_rates for e in epochs]
    assert "lr" not in rows[0]


def test_one_group_is_lr_and_several_are_numbered():
    assert {name: value for name, value in scalars(EpochEnd(epoch=1, learning_rates=[0.1])).values.items()
            if name.startswith("lr")} == {"lr": 0.1}
    several = scalars(EpochEnd(epoch=2, learning_rates=[0.1, 0.02, 0.003]))
    assert several.step == 2
    assert {name: value for name, value in several.values.items() if name.startswith("lr")} == {
        "lr/group0": 0.1, "lr/group1": 0.02, "lr/group2": 0.003}


def test_an_older_record_without_rates_still_reads_and_logs_no_rate(tmp_path):
    older = parse({"event": "epoch_end", "epoch": 1, "step": 4, "train_loss": 0.5})
    assert older.learning_rates is None and "learning_rates" not in older.record()
    assert not any(name.startswith("lr") for name in scalars(older).values)
    logger = CsvLogger(tmp_path, test_metrics=())
    logger.write(older)
    logger.close()
    (row,) = csv_rows(tmp_path)
    assert not any(name.startswith("lr") for name in row)


def test_the_rates_go_through_events_jsonl_unchanged(tmp_path):
    log = EventLog(tmp_path)
    log.write(EpochEnd(epoch=1, learning_rates=[0.1, 1e-5]))
    log.close()
    (epoch,) = read_history(tmp_path).epochs
    assert epoch.learning_rates == [0.1, 1e-5]


def test_the_csv_columns_of_one_group_and_of_several(tmp_path):
    for folder, rates, columns in (("one", [0.1], ["lr"]), ("two", [0.1, 0.01], ["lr.group0", "lr.group1"])):
        (tmp_path / folder).mkdir()
        logger = CsvLogger(tmp_path / folder, test_metrics=())
        for epoch in (1, 2):
            logger.write(EpochEnd(epoch=epoch, learning_rates=[rate / epoch for rate in rates]))
        logger.close()
        rows = csv_rows(tmp_path / folder)
        assert [name for name in rows[0] if name.startswith("lr")] == columns
        assert [[float(row[name]) for name in columns] for row in rows] == [rates, [rate / 2 for rate in rates]]


def test_tensorboard_and_mlflow_hold_each_groups_rate(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from shoal.train.loggers.to_mlflow import FILE_STORE, PATIENCE, MlflowLogger
    from shoal.train.loggers.to_tensorboard import TensorBoardLogger

    for name, value in (PATIENCE | FILE_STORE).items():  # set here, so the process's environment is put back
        monkeypatch.setenv(name, value)
    records = [EpochEnd(epoch=epoch, time=1000.0 + epoch, learning_rates=[0.1 / epoch, 0.01 / epoch])
               for epoch in (1, 2)]
    board, tracking = TensorBoardLogger(tmp_path), MlflowLogger(tmp_path, None, "rates")
    for logger in (board, tracking):
        for record in records:
            logger.write(record)
        logger.close()
    read = EventAccumulator(str(tmp_path / "tensorboard"))
    read.Reload()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    for group in (0, 1):
        rates = [record.learning_rates[group] for record in records]
        board_scalars = read.Scalars(f"lr/group{group}")
        assert [s.step for s in board_scalars] == [1, 2]
        assert [s.value for s in board_scalars] == pytest.approx(rates)  # float32 in TensorBoard's files
        history = sorted(client.get_metric_history(tracking.run_id, f"lr/group{group}"), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == list(zip([1, 2], rates))
