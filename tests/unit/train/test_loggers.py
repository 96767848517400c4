"""TensorBoard, MLflow and the CSV file read back with their own readers equal events.jsonl.

One tiny job in process (a world of one) with every logger on, stopped after two epochs and
resumed for a third; the readers are TensorBoard's EventAccumulator, MLflow's client on the file
store and the csv module. The failure and configuration rules are driven from records by hand.
"""

from __future__ import annotations

import csv
import io
import os

import pytest

from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.config import OutputConfig
from shoal.errors import ConfigError
from shoal.events import EpochEnd, JobStart, Validation, read_history
from shoal.train.loggers import Loggers, check_installed, open_loggers
from shoal.train.loggers.to_csv import CSV_FILE, CsvLogger
from shoal.train.loggers.to_mlflow import PATIENCE, RUN_FILE
from shoal.train.runner import Runner
from tests.unit.train.test_runner import job

LOGGERS = ["tensorboard", "mlflow", "csv"]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """A run of 2 epochs resumed for a 3rd, every logger on, validations every 5 steps."""
    tmp_path = tmp_path_factory.mktemp("loggers")
    before = dict(os.environ)  # the MLflow logger sets its defaults in the process it runs in
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for epochs, resume in ((2, False), (3, True)):
        config = job(tmp_path, epochs=epochs, validate_every=5)
        config.output.loggers = LOGGERS
        Runner(config, DistInfo(), run_dir, threads=1, resume=resume, comm=Communicator(0, 1)).run()
    yield run_dir
    os.environ.clear()
    os.environ.update(before)


def test_tensorboard_reads_back_the_numbers_of_events_jsonl(resumed_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    history = read_history(resumed_run)
    board = EventAccumulator(str(resumed_run / "tensorboard"))
    board.Reload()
    epochs = history.epochs
    assert [s.step for s in board.Scalars("train/loss")] == [1, 2, 3]  # the resumed job's curve goes on
    assert [s.value for s in board.Scalars("train/loss")] == pytest.approx(
        [e.train_loss for e in epochs])  # float32 in TensorBoard's files
    for name in ("accuracy", "loss"):
        assert [s.value for s in board.Scalars(f"test/{name}")] == pytest.approx([e.test[name] for e in epochs])
    assert [s.value for s in board.Scalars("throughput/samples_per_second")] == pytest.approx(
        [e.samples_per_second for e in epochs])
    assert [s.value for s in board.Scalars("time/compute")] == pytest.approx(
        [e.seconds_split.compute for e in epochs])
    validations = history.of(Validation)
    assert validations and [s.step for s in board.Scalars("validation/accuracy")] == [v.count for v in validations]
    assert [s.value for s in board.Scalars("validation/accuracy")] == pytest.approx(
        [v.test["accuracy"] for v in validations])
    assert [s.wall_time for s in board.Scalars("train/loss")] == pytest.approx([e.time for e in epochs])
    assert any(tag.startswith("job/config") for tag in board.Tags()["tensors"])


def test_mlflow_reads_back_the_metrics_and_params_in_one_run(resumed_run, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")

    history = read_history(resumed_run)
    client = MlflowClient(tracking_uri=(resumed_run / "mlruns").resolve().as_uri())
    (experiment,) = [found for found in client.search_experiments() if found.name == "tiny"]
    (run,) = client.search_runs([experiment.experiment_id])  # the resumed job went on in the same run
    assert run.info.run_id in (resumed_run / RUN_FILE).read_text()
    assert run.info.status == "FINISHED"
    loss = sorted(client.get_metric_history(run.info.run_id, "train/loss"), key=lambda metric: metric.step)
    assert [(m.step, m.value) for m in loss] == [(e.epoch, e.train_loss) for e in history.epochs]
    accuracy = sorted(client.get_metric_history(run.info.run_id, "test/accuracy"), key=lambda metric: metric.step)
    assert [m.value for m in accuracy] == [e.test["accuracy"] for e in history.epochs]
    assert run.data.metrics["final/accuracy"] == history.end.test["accuracy"]
    params = run.data.params
    assert params["train.epochs"] == "2"  # the first start's: a param never changes
    assert params["train.optimizer.name"] == "adam" and params["train.batch_size"] == "8"
    assert params["run.world_size"] == "1" and params["model.layers"].startswith("[{")


def test_the_csv_file_holds_one_row_per_epoch_end(resumed_run):
    history = read_history(resumed_run)
    text = (resumed_run / CSV_FILE).read_text()
    assert text.count("epoch,step,time") == 1  # the resumed job appended under the header
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(history.epochs) == 3
    for row, epoch in zip(rows, history.epochs):
        assert int(row["epoch"]) == epoch.epoch and int(row["step"]) == epoch.step
        assert float(row["train_loss"]) == epoch.train_loss and float(row["time"]) == epoch.time
        assert float(row["samples_per_second"]) == epoch.samples_per_second
        assert {name: float(row[f"test.{name}"]) for name in epoch.test} == epoch.test
        assert float(row["seconds_split.data"]) == epoch.seconds_split.data


def test_a_crashed_jobs_torn_row_is_dropped_and_its_columns_kept(tmp_path):
    (tmp_path / CSV_FILE).write_text("epoch,step,time,train_loss\n1,4,10.0,0.5\n2,8,1")
    logger = CsvLogger(tmp_path, test_metrics=("loss",))
    logger.write(EpochEnd(epoch=2, step=8, time=11.0, train_loss=0.25, test={"loss": 0.3}))
    logger.close()
    assert (tmp_path / CSV_FILE).read_text() == "epoch,step,time,train_loss\n1,4,10.0,0.5\n2,8,11.0,0.25\n"


class Broken:
    def __init__(self):
        self.closed = False

    def write(self, event):
        raise ConnectionError("tracking server at http://mlflow:5000 refused the connection\nretried 3 times")

    def close(self):
        self.closed = True


class Kept:
    def __init__(self):
        self.events = []

    def write(self, event):
        self.events.append(event)

    def close(self):
        pass


def test_a_failing_logger_warns_once_and_the_others_go_on():
    stream, broken, kept = io.StringIO(), Broken(), Kept()
    loggers = Loggers({"mlflow": broken, "csv": kept}, stream)
    for epoch in (1, 2):
        loggers(EpochEnd(epoch=epoch))
    loggers.close()
    assert stream.getvalue() == ("shoal: warning: the mlflow logger failed and is off for the rest of the job: "
                                 "tracking server at http://mlflow:5000 refused the connection\n")
    assert broken.closed and [event.epoch for event in kept.events] == [1, 2]


def test_an_mlflow_server_that_is_down_turns_the_logger_off(tmp_path, monkeypatch):
    for name, value in PATIENCE.items():  # set here, so the test leaves the process's environment as it was
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    config = job(tmp_path)
    config.output.loggers, config.output.mlflow_uri = ["mlflow", "csv"], "http://127.0.0.1:9"
    stream = io.StringIO()
    loggers = open_loggers(config, tmp_path, ("loss",), stream)
    loggers(JobStart(job="tiny"))
    loggers(EpochEnd(epoch=1))
    loggers.close()
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("shoal: warning: the mlflow logger failed and is off for the rest of the job: ")
    assert (tmp_path / CSV_FILE).read_text().count("\n") == 2  # the header and the epoch


@pytest.mark.parametrize("loggers,message", [
    (["tensorbord"], "output.loggers: unknown logger 'tensorbord'; choose from csv, mlflow, tensorboard"),
    (["csv", "csv"], "output.loggers: 'csv' is named twice"),
    ("csv", "output.loggers: must be a list of names from csv, mlflow, tensorboard, got 'csv'"),
])
def test_bad_logger_names_are_one_line_errors(loggers, message):
    with pytest.raises(ConfigError) as raised:
        OutputConfig(loggers=loggers)
    assert str(raised.value) == message


def test_a_job_file_with_a_bad_logger_names_the_key(tmp_path):
    from shoal.jobs import load_job

    path = tmp_path / "job.toml"
    path.write_text('[model]\nlayers = [{ dense = 2 }]\n[data]\ntrain = "d"\n[output]\nloggers = ["wandb"]\n')
    expected = r"/job\.toml: output\.loggers: unknown logger 'wandb'; choose from csv, mlflow, tensorboard$"
    with pytest.raises(ConfigError, match=expected):
        load_job(path)


def test_a_missing_package_is_named_with_its_pip_command_before_anything_starts(tmp_path, monkeypatch):
    import importlib.util

    from shoal import api

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "mlflow" else real(name))
    check_installed(["csv", "tensorboard"])
    config = job(tmp_path)
    config.output.loggers = ["csv", "mlflow"]
    config.data.train = str(tmp_path / "missing")  # the logger is checked before the data
    with pytest.raises(ConfigError) as raised:
        api.start(config, tmp_path / "run")
    assert str(raised.value) == "output.loggers: 'mlflow' needs the mlflow package: pip install 'shoal[mlflow]'"
    assert not (tmp_path / "run").exists()
