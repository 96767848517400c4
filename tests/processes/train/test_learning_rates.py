"""Real workers record each param group's learning rate at every epoch, in events.jsonl and metrics.csv.

Two groups of different rates and a StepLR that halves both after every epoch: each epoch's record holds the
rates it trained with, whichever rank 0 is (a trainer of sync, Downpour's server, whose optimizer steps).
"""

from __future__ import annotations

import csv
import io

import pytest

import shoal
from shoal.events import read_history
from shoal.train.loggers.to_csv import CSV_FILE
from tests.e2e.jobs import write_task

RATE, BIAS_RATE, GAMMA, EPOCHS = 0.01, 0.002, 0.5, 3
EXPECTED = [[BIAS_RATE * GAMMA**epoch, RATE * GAMMA**epoch] for epoch in range(EPOCHS)]
"""The listed group (the biases) first, then the parameters left."""


@pytest.mark.timeout(240)  # 10 to 20 seconds each on two shared cores
@pytest.mark.parametrize("algorithm", ["sync", "downpour"])
def test_workers_record_both_groups_rates_every_epoch(tmp_path, algorithm):
    train, test = write_task(tmp_path, rows=600, test_rows=100)
    job = {"model": {"layers": [{"dense": 8, "activation": "relu"}, {"dense": 2}]},
           "data": {"train": str(train), "test": str(test)},
           "train": {"epochs": EPOCHS, "batch_size": 64,
                     "optimizer": {"name": "sgd", "lr": RATE, "param_groups": [{"params": "bias$", "lr": BIAS_RATE}]},
                     "scheduler": {"name": "StepLR", "step_size": 1, "gamma": GAMMA}},
           "algorithm": {"name": algorithm},
           "output": {"progress": "none", "loggers": ["csv"]}, "checkpoint": {"every": 0}, "cluster": {"threads": 1}}
    run_dir = shoal.fit(job, workers=2, run_dir=tmp_path / "run").run_dir
    epochs = read_history(run_dir).epochs
    assert [epoch.epoch for epoch in epochs] == [1, 2, 3]
    for epoch, expected in zip(epochs, EXPECTED):
        assert epoch.learning_rates == pytest.approx(expected)
    rows = list(csv.DictReader(io.StringIO((run_dir / CSV_FILE).read_text())))
    assert [[float(row["lr.group0"]), float(row["lr.group1"])] for row in rows] == [e.learning_rates for e in epochs]
