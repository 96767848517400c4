"""The line each epoch prints: the loss, what the user's step logged, the held-out rows' and the test metrics."""

from __future__ import annotations

import io

from shoal.events import EpochEnd, SecondsSplit
from shoal.train.progress import ProgressDisplay


def line(record: EpochEnd) -> str:
    stream = io.StringIO()
    ProgressDisplay("lines", 3, 10, enabled=True, stream=stream).end_epoch(0, record)
    return stream.getvalue().strip()


def test_an_epochs_line_names_every_number_once_with_single_gaps():
    record = EpochEnd(epoch=1, train_loss=0.5, test={"loss": 0.4, "accuracy": 0.9}, samples_per_second=1000.0,
                      seconds_split=SecondsSplit(compute=1.0, communication=0.5, data=0.25, evaluation=0.25),
                      train_metrics={"penalty": 0.01}, validation={"loss": 0.45, "accuracy": 0.88, "rows": 120.0})
    assert line(record) == ("epoch 1/3  train_loss 0.5000  train_penalty 0.0100  held_out_loss 0.4500  "
                            "held_out_accuracy 0.8800  loss 0.4000  accuracy 0.9000  1,000 samples/s  "
                            "[compute 1.00s  communication 0.50s  data 0.25s  evaluation 0.25s]")
    plain = line(EpochEnd(epoch=1, train_loss=0.5, samples_per_second=10.0))
    assert plain.startswith("epoch 1/3  train_loss 0.5000  10 samples/s  [") and "   " not in plain
