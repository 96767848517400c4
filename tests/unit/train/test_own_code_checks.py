"""What the launcher checks of a job with the user's own code, before any worker starts."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.data.format import DatasetWriter
from shoal.data.in_memory import write_in_memory
from shoal.errors import ConfigError
from shoal.events import EpochEnd
from shoal.jobs import from_dict
from shoal.train.prepare import prepare
from shoal.train.stopping import epoch_metrics
from tests.e2e.jobs import write_task

STEP = "tests.support.own_code:step"


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("task"), rows=200, test_rows=20)


def job(task, **train):
    train_set, test_set = task
    return from_dict({"model": {"layers": [{"dense": 2}]}, "data": {"train": str(train_set), "test": str(test_set)},
                      "train": train}, name="job")


@pytest.mark.parametrize("metric", ["train_loss", "test_loss", "test_accuracy", "test_auc"])
def test_a_stop_rule_on_a_metric_the_job_measures_is_taken(task, metric):
    prepare(job(task, stop={"metric": metric, "below": 0.1}))


@pytest.mark.parametrize("train,message", [
    ({"stop": {"metric": "test_f1", "above": 0.9}}, r"'test_f1' is not a metric this job measures: train_loss, "
                                                    r"test_loss, test_accuracy, test_auc$"),
    ({"stop": {"metric": "validation_loss", "below": 0.1}}, r"'validation_loss' is not a metric"),
    ({"stop": {"metric": "train_penalty", "below": 0.1}}, r"'train_penalty' is not a metric"),
    ({"stop": {"metric": "accuracy", "above": 0.9}}, r"'accuracy' is not a metric"),
])
def test_a_stop_rule_on_a_metric_no_epoch_has_is_refused(task, train, message):
    with pytest.raises(ConfigError, match=rf"^train.stop.metric: {message}"):
        prepare(job(task, **train))


def test_with_a_split_and_a_step_the_held_out_and_logged_metrics_can_stop_a_job(task):
    prepare(job(task, validation_split=0.2, stop={"metric": "validation_accuracy", "above": 0.9}))
    prepare(job(task, step=STEP, stop={"metric": "train_penalty", "below": 0.1}))
    record = EpochEnd(train_loss=0.5, test={"loss": 0.4}, train_metrics={"penalty": 0.01},
                      validation={"loss": 0.45, "rows": 40.0})
    assert epoch_metrics(record) == {"train_loss": 0.5, "train_penalty": 0.01, "test_loss": 0.4,
                                     "validation_loss": 0.45}


def test_background_validation_does_not_run_the_users_step(tmp_path):
    """Rows of fields are evaluated by the step: not in another thread beside training."""
    rows = 40
    features = np.random.default_rng(0).normal(size=(rows, 3)).astype(np.float32)
    folder = tmp_path / "fields"
    items = [{"x": features[index], "label": int(features[index, 0] > 0)} for index in range(rows)]
    write_in_memory(items, str(folder), "train")
    fields = from_dict({"model": {"layers": [{"dense": 2}]}, "data": {"train": str(folder), "test": str(folder)},
                        "train": {"step": STEP, "validate_every": 5}}, name="job")
    with pytest.raises(ConfigError, match=r"^train.validate_every: the test set is evaluated by train.step"):
        prepare(fields)


def test_a_step_on_a_numeric_label_reads_the_outputs_as_values(tmp_path):
    features = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    with DatasetWriter(str(tmp_path / "train"), (3,), "float32") as writer:
        writer.write(features, features[:, 0] * 2.0)
    numeric = {"model": {"layers": [{"dense": 1}]}, "data": {"train": str(tmp_path / "train")}}
    with pytest.raises(ConfigError, match="needs class labels"):
        prepare(from_dict(numeric, name="job"))
    prepared = prepare(from_dict({**numeric, "train": {"step": "tests.support.own_code:regression"}}, name="job"))
    assert prepared.objective.loss == "mse"
