"""train.metrics: the user's functions and torchmetrics objects, computed beside the built-in metrics.

F1 and PR-AUC are worked out by hand on known outputs; a job run in process shows the names in every
record and the CSV file, and the background validation's copies of a stateful metric.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from torch import nn
from torchmetrics.classification import (
    BinaryAveragePrecision,
    BinaryF1Score,
    MulticlassAccuracy,
    MulticlassF1Score,
)
from torchmetrics.functional.classification import binary_f1_score

from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.errors import ConfigError, ShoalError
from shoal.events import EventLog
from shoal.jobs import from_dict
from shoal.train.loggers.scalars import scalars
from shoal.train.objective import Objective, evaluate, metric_names
from shoal.train.user_metrics import UserMetrics, built, load_metrics
from shoal.train.validation import Validator
from tests.distributed.common import write_dataset

# One logit per row, and each row's class: predicted positive where the logit is above 0.
LOGITS = np.array([2.0, -1.0, 0.5, -0.3, 3.0, -2.0, 0.1], dtype=np.float32)
LABELS = np.array([1, 0, 0, 1, 1, 0, 1])
# Predicted [1,0,1,0,1,0,1]: 3 true positives (rows 0, 4, 6), 1 false positive (2), 1 false negative (3).
POSITIVE_F1 = 2 * 3 / (2 * 3 + 1 + 1)
# Class 0: 2 true (rows 1, 5), 1 false (3), 1 missed (2).
NEGATIVE_F1 = 2 * 2 / (2 * 2 + 1 + 1)
# Ranked by logit: 1, 1, 0, 1, 1, 0, 0; precision at each positive 1/1, 2/2, 3/4, 4/5.
AVERAGE_PRECISION = (1 + 1 + 3 / 4 + 4 / 5) / 4


def convert(features, labels):
    return torch.from_numpy(np.asarray(features)), torch.from_numpy(np.asarray(labels))


def positive_f1(outputs, labels):
    """F1 of class 1 from one logit per row, by counting."""
    predicted = outputs > 0
    true = int((predicted & (labels == 1)).sum())
    return 2 * true / (2 * true + int((predicted & (labels == 0)).sum()) + int((~predicted & (labels == 1)).sum()))


def two_logit_f1(outputs, labels):
    """The positive class's F1 from two logits per row, as the module's docstring tells."""
    return binary_f1_score(outputs.softmax(dim=1)[:, 1], labels)


def hits(outputs, labels):
    return (outputs.argmax(dim=1) == labels).float().mean()


ACCURACY = MulticlassAccuracy(num_classes=3, average="micro")
NOT_A_METRIC = 42


def test_a_function_and_torchmetrics_give_f1_and_pr_auc_of_one_logit_outputs_over_batches():
    """binary_cross_entropy: outputs (rows, 1) reach the metrics as (rows,); batches of 4 rows feed the objects
    (each with a logit outside [0, 1], which tells torchmetrics that it is given logits)."""
    metrics = UserMetrics({"f1": positive_f1, "torch_f1": BinaryF1Score(), "pr_auc": BinaryAveragePrecision()})
    found = evaluate(nn.Identity(), Objective("binary_cross_entropy", 2), LOGITS[:, None], LABELS, convert,
                     batch_size=4, metrics=metrics)
    assert found["f1"] == pytest.approx(POSITIVE_F1) == pytest.approx(0.75)
    assert found["torch_f1"] == pytest.approx(POSITIVE_F1)
    assert found["pr_auc"] == pytest.approx(AVERAGE_PRECISION)
    assert set(found) == {"loss", "accuracy", "auc", "f1", "torch_f1", "pr_auc"}
    assert all(type(value) is float for value in found.values())
    again = evaluate(nn.Identity(), Objective("binary_cross_entropy", 2), LOGITS[:, None], LABELS, convert,
                     batch_size=4, metrics=metrics)
    assert again == found  # each evaluation starts afresh: the objects were reset


def test_two_logit_outputs_macro_f1_is_not_the_positive_classes():
    outputs = np.stack([np.zeros_like(LOGITS), LOGITS], axis=1)  # softmax's class 1 is sigmoid(logit)
    metrics = UserMetrics({"f1": two_logit_f1, "macro_f1": MulticlassF1Score(num_classes=2)})
    found = evaluate(nn.Identity(), Objective("cross_entropy", 2), outputs, LABELS, convert, batch_size=4,
                     metrics=metrics)
    assert found["f1"] == pytest.approx(POSITIVE_F1)
    assert found["macro_f1"] == pytest.approx((POSITIVE_F1 + NEGATIVE_F1) / 2)


def test_functions_get_the_whole_test_set_on_the_cpu_as_float32():
    seen = []

    def record(outputs, labels):
        seen.append((outputs.shape, outputs.dtype, outputs.device.type, labels.dtype, labels.tolist()))
        return 0

    evaluate(nn.Identity(), Objective("cross_entropy", 2), np.stack([LOGITS, -LOGITS], axis=1), LABELS, convert,
             batch_size=2, metrics=UserMetrics({"record": record}))
    assert seen == [((7, 2), torch.float32, "cpu", torch.int64, LABELS.tolist())]  # once, all 7 rows


def test_a_copy_keeps_its_own_state():
    """Background validation's copy and the epoch's evaluation, fed in turns, never mix their counts."""
    original = UserMetrics({"f1": BinaryF1Score(), "hits": positive_f1})
    copied = original.copy()
    assert copied.metrics["f1"] is not original.metrics["f1"]
    logits, labels = torch.from_numpy(LOGITS), torch.from_numpy(LABELS)
    original.start()
    copied.start()
    for first in range(0, 7, 4):
        original.update(logits[first:first + 4, None], labels[first:first + 4])
        copied.update(-logits[first:first + 4, None], labels[first:first + 4])  # every prediction flipped
    assert original.compute()["f1"] == pytest.approx(POSITIVE_F1)
    assert copied.compute() == {"f1": pytest.approx(2 / 7), "hits": pytest.approx(2 / 7)}  # 1 hit, 2 false, 3 missed


def test_an_object_without_reset_starts_each_evaluation_as_it_was_loaded():
    class Count:
        def __init__(self):
            self.rows = 0

        def update(self, outputs, labels):
            self.rows += len(labels)

        def compute(self):
            return self.rows

    metrics = UserMetrics({"rows": Count()})
    for _ in range(2):
        assert evaluate(nn.Identity(), Objective("binary_cross_entropy", 2), LOGITS[:, None], LABELS, convert,
                        batch_size=3, metrics=metrics)["rows"] == 7.0


def test_torchmetrics_never_gathers_across_processes_on_rank_0_alone():
    """A process group exists in a job; rank 0 alone computes, so a gather would wait for ranks that never come.
    Told that it runs distributed, an untouched metric tries to gather; a loaded one does not."""
    def distributed():
        return True

    untouched = BinaryF1Score(distributed_available_fn=distributed)
    untouched.update(torch.from_numpy(LOGITS), torch.from_numpy(LABELS))
    with pytest.raises(ValueError, match="process group has not been initialized"):
        untouched.compute()
    loaded = built(BinaryF1Score(distributed_available_fn=distributed), "f1", "f1.pkl")
    metrics = UserMetrics({"f1": loaded})
    metrics.start()
    metrics.update(torch.from_numpy(LOGITS), torch.from_numpy(LABELS))
    assert metrics.compute()["f1"] == pytest.approx(POSITIVE_F1)


def test_references_load_functions_objects_and_classes():
    metrics = load_metrics({"f1": "tests.unit.train.test_user_metrics:positive_f1",
                            "torch_f1": "torchmetrics.classification:BinaryF1Score"}, None)
    assert metrics.names == ("f1", "torch_f1")
    assert isinstance(metrics.metrics["torch_f1"], BinaryF1Score)  # a class, built with no arguments
    found = evaluate(nn.Identity(), Objective("binary_cross_entropy", 2), LOGITS[:, None], LABELS, convert,
                     metrics=metrics)
    assert found["f1"] == found["torch_f1"] == pytest.approx(POSITIVE_F1)
    assert metric_names(Objective("binary_cross_entropy", 2), metrics.names) == (
        "loss", "accuracy", "auc", "f1", "torch_f1")


@pytest.mark.parametrize("table, message", [
    ({"accuracy": "tests.unit.train.test_user_metrics:hits"},
     "train.metrics.accuracy: 'accuracy' is the name of a built-in test metric (loss, accuracy, auc, rmse)"),
    ({"f1": "tests.unit.train.test_user_metrics:NOT_A_METRIC"},
     "train.metrics.f1: 'tests.unit.train.test_user_metrics:NOT_A_METRIC' is a int, not a function"),
    ({"f1": "torchmetrics.classification:MulticlassF1Score"},
     "train.metrics.f1: 'torchmetrics.classification:MulticlassF1Score' is a class that cannot be built"),
    ({"f1": "tests.unit.train.no_such_module:f1"}, "train.metrics.f1: cannot import"),
])
def test_a_bad_metric_is_one_line_naming_its_key(table, message):
    with pytest.raises(ConfigError) as raised:
        load_metrics(table, None)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_a_failure_inside_a_metric_is_one_line_naming_it():
    def broken(outputs, labels):
        raise ValueError("labels must be 0 or 1\nmore detail")

    def pair(outputs, labels):
        return torch.tensor([0.5, 0.5])

    for metric, message in ((broken, "train.metrics.f1: ValueError: labels must be 0 or 1"),
                            (pair, "train.metrics.f1: returned a Tensor of shape (2,), not a number"),
                            (BinaryF1Score(), "train.metrics.f1: RuntimeError: Predictions and targets are expected "
                                              "to have the same shape")):
        with pytest.raises(ShoalError) as raised:  # two logits where BinaryF1Score wants one
            evaluate(nn.Identity(), Objective("cross_entropy", 2), np.stack([LOGITS, -LOGITS], axis=1), LABELS,
                     convert, metrics=UserMetrics({"f1": metric}))
        assert str(raised.value).startswith(message)
        assert "\n" not in str(raised.value)


def test_a_metric_failing_in_the_background_fails_the_training_thread(tmp_path):
    def broken(outputs, labels):
        raise KeyError("f1")

    model = nn.Linear(2, 2)
    events = EventLog(tmp_path)
    try:
        validator = Validator(model, Objective("cross_entropy", 2), (np.stack([LOGITS, -LOGITS], axis=1), LABELS),
                              convert, events, every=1, metrics=UserMetrics({"f1": broken}))
        validator.offer(1)
        with pytest.raises(ShoalError, match="train.metrics.f1: KeyError: 'f1'"), validator.paused():
            pass
    finally:
        events.close()


def tiny_job(tmp_path, **train):
    train_set, test_set = str(tmp_path / "train"), str(tmp_path / "test")
    write_dataset(train_set, rows=96, seed=1)
    write_dataset(test_set, rows=30, seed=2)
    return from_dict({
        "model": {"layers": [{"dense": 8, "activation": "tanh"}, {"dense": 3}]},
        "data": {"train": train_set, "test": test_set},
        "train": {"epochs": 2, "batch_size": 8, "optimizer": {"name": "adam", "lr": 0.01}, **train},
        "output": {"progress": "none", "loggers": ["csv"]},
    }, name="tiny")


def test_a_jobs_metrics_reach_every_record_and_the_csv_file(tmp_path):
    """A function and a torchmetrics object, both accuracy by another name: equal to the built-in one in every
    epoch_end, validation and job_end record (the background copies included) and in metrics.csv."""
    from shoal.train.runner import Runner

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = tiny_job(tmp_path, validate_every=3, metrics={"hits": "tests.unit.train.test_user_metrics:hits",
                                                        "counted": "tests.unit.train.test_user_metrics:ACCURACY"})
    runner = Runner(job, DistInfo(), run_dir, threads=1, comm=Communicator(0, 1))
    final = runner.run()
    records = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    tested = [record for record in records if record["event"] in ("epoch_end", "validation", "job_end")]
    assert {record["event"] for record in tested} == {"epoch_end", "validation", "job_end"}
    for record in tested:
        test = record["test"]
        assert test["hits"] == pytest.approx(test["accuracy"]) == pytest.approx(test["counted"]), record["event"]
    assert final["hits"] == pytest.approx(final["accuracy"])
    with open(run_dir / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [float(row["test.hits"]) for row in rows] == pytest.approx(
        [record["test"]["hits"] for record in records if record["event"] == "epoch_end"])
    assert float(rows[-1]["test.counted"]) == pytest.approx(final["counted"])
    # TensorBoard and MLflow write what `scalars` gives
    assert runner.coordinator.latest is not None
    assert scalars(runner.coordinator.latest).values["test/hits"] == pytest.approx(final["hits"])
    assert runner.coordinator.validator.metrics.metrics["counted"] is not runner.coordinator.metrics.metrics["counted"]


def test_metrics_without_a_test_set_are_refused(tmp_path):
    from shoal.train.prepare import prepare

    job = tiny_job(tmp_path, metrics={"hits": "tests.unit.train.test_user_metrics:hits"})
    job.data.test = None
    with pytest.raises(ConfigError, match=r"^train.metrics: computed on the test set, and the job has none"):
        prepare(job)  # in the launcher, before any worker starts
