"""`shoal.fit` on a user's own objects: a module class no other process can import, arrays, a DataFrame,
a torch Dataset, callbacks; and what it refuses, leaving nothing behind."""

from __future__ import annotations

import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import shoal
from shoal.data.importers import import_dataset
from shoal.errors import ConfigError, DataError
from shoal.events import read_history
from tests.e2e.jobs import FEATURES

ROWS, TEST_ROWS = 4000, 1000
SETTINGS = {"algorithm": "sync", "epochs": 3, "batch_size": 64, "optimizer": {"name": "adam", "lr": 0.01},
            "output": {"progress": "none"}, "checkpoint": {"every": 0}}


def arrays(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(seed)
    features = generator.normal(size=(rows, FEATURES)).astype(np.float32)
    return features, (features[:, 0] * features[:, 1] + features[:, 2] > 0).astype(np.int64)


@pytest.fixture(scope="module")
def data():
    return arrays(ROWS, 0), arrays(TEST_ROWS, 1)


def local_network() -> nn.Module:
    """A class defined here, inside a function: no worker can import it, so it must travel by value."""

    class Network(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden, self.out = nn.Linear(FEATURES, 32), nn.Linear(32, 2)

        def forward(self, inputs):
            return self.out(torch.relu(self.hidden(inputs)))

    torch.manual_seed(0)  # the job's train.seed: the weights a layer list of the same shape starts from
    return Network()


def test_a_module_and_arrays_train_as_the_same_job_from_a_job_file(data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # a temporary directory of the test's own: other tests' fits, running beside this one, stage theirs in /tmp
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    (train, test) = data
    staged_before = set(Path(tempfile.gettempdir()).glob("shoal-data.*"))
    from_objects = shoal.fit(model=local_network(), train=train, test=test, workers=2, **SETTINGS)
    assert set(Path(tempfile.gettempdir()).glob("shoal-data.*")) == staged_before  # the arrays' datasets are gone
    for name, (features, labels) in (("train", train), ("test", test)):
        np.save(tmp_path / f"{name}-x.npy", features)
        np.save(tmp_path / f"{name}-y.npy", labels)
        import_dataset(tmp_path / f"{name}-x.npy", tmp_path / name, "npy", label=str(tmp_path / f"{name}-y.npy"))
    job = tmp_path / "job.toml"
    job.write_text(f"""
[model]
layers = [{{ dense = 32, activation = "relu" }}, {{ dense = 2 }}]
[data]
train = "{tmp_path / 'train'}"
test = "{tmp_path / 'test'}"
""")
    from_file = shoal.fit(job, workers=2, **SETTINGS)
    assert from_objects.metrics["accuracy"] > 0.85
    assert from_objects.metrics == from_file.metrics  # the same start, data and steps: the same job
    for shipped, built in zip(from_objects.model.parameters(), from_file.model.parameters(), strict=True):
        assert torch.equal(shipped, built)
    assert isinstance(from_objects.model, nn.Module) and type(from_objects.model).__name__ == "Network"
    with pytest.raises(ConfigError, match="model.object"):  # a run directory's pickle is code: not unasked
        shoal.load_model(from_objects.run_dir)
    assert shoal.load_model(from_objects.run_dir, trust_code=True)(torch.zeros(3, FEATURES)).shape == (3, 2)


def test_a_dataframe_with_its_label_column_and_a_callable(data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    frames = []
    for features, labels in data:
        frame = pd.DataFrame(features, columns=[f"x{column}" for column in range(FEATURES)])
        frames.append(frame.assign(outcome=np.where(labels == 1, "yes", "no")))
    result = shoal.fit(model=lambda: nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 2)),
                       train=frames[0], test=frames[1], label="outcome", workers=1, **SETTINGS)
    assert result.metrics["accuracy"] > 0.85


class StopAfter:
    def __init__(self, epochs: int):
        self.epochs = epochs

    def on_epoch_end(self, epoch: int, metrics: dict) -> bool:
        return epoch + 1 >= self.epochs


def test_a_torch_dataset_and_a_callback_that_stops_the_job_in_a_notebook(data, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))  # as a Jupyter kernel
    (features, labels), test = data
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(features), torch.from_numpy(labels))
    settings = {key: value for key, value in SETTINGS.items() if key != "output"} | {"epochs": 5}
    result = shoal.fit(model=local_network(), train=dataset, test=test, workers=1, callbacks=[StopAfter(2)],
                       **settings)
    assert [epoch.epoch for epoch in result.epochs] == [1, 2]  # asked to stop after the second of five
    assert result.metrics["accuracy"] > 0.8
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in shown] == ["1/5", "2/5"]  # printed by this process, for the cell
    assert "train loss" in shown[-1]


def test_refusals_are_one_line_and_leave_no_run_directory(data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (train, test) = data
    frame = pd.DataFrame(train[0]).assign(label=train[1])
    cases = [
        (dict(model=42, train=train), "model: expected an nn.Module"),
        (dict(model=local_network(), train=frame), "label: required with a DataFrame"),
        (dict(model=local_network(), train=frame, label="nope"), "label: train has no column 'nope'"),
        (dict(model=local_network(), train=(train[0], train[1][:10])), "train: 4000 rows of features but 10"),
        (dict(model=local_network(), train=train, trainer={"epochs": 1}), "fit: unknown argument 'trainer'"),
        (dict(model=local_network(), train=train, callbacks=[object()]), "callbacks: object has no on_epoch_end"),
        (dict(model=nn.Linear(FEATURES, 7), train=train), "model: the model gives outputs of shape \\[7\\]"),
    ]
    for arguments, message in cases:
        with pytest.raises(ConfigError, match=message) as raised:
            shoal.fit(**arguments, run_dir=tmp_path / "run", **SETTINGS)
        assert "\n" not in str(raised.value)
        assert not (tmp_path / "run").exists(), message


def test_train_stop_ends_every_worker_after_the_same_epoch(data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (train, test) = data
    settings = SETTINGS | {"epochs": 6, "checkpoint": {"every": 3}}
    result = shoal.fit(model=local_network(), train=train, test=test, workers=2,
                       stop={"metric": "test_accuracy", "above": 0.5}, **settings)
    assert [epoch.epoch for epoch in result.epochs] == [1]  # above 50% after the first epoch
    assert len(result.epochs[0].workers) == 2
    end = read_history(result.run_dir).end
    assert end.completed and end.epochs == 1 and "test_accuracy" in end.message and "above 0.5" in end.message
    assert [path.name for path in (result.run_dir / "checkpoints").iterdir()] == ["epoch-00001"]  # due at the stop


def test_bad_arrays_are_refused_before_any_worker_starts_naming_the_argument(data, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (train, test) = data
    with_nan = train[0].copy()
    with_nan[41, 3] = np.nan
    other_class = test[1].copy()
    other_class[9] = 7
    cases = [
        (dict(train=(with_nan, train[1])), DataError,
         "train: row 42 (index 41) of the features holds a non-finite value (nan): fix or drop it before fit"),
        (dict(train=train, test=(test[0], other_class)), DataError,
         "test: row 10 (index 9) has label 7, which is not one of the training labels [0, 1]"),
        (dict(train=train, cluster={"device": "cuda"}), ConfigError, "cluster.device: 'cuda' asked for but"),
    ]
    if torch.cuda.is_available():
        cases.pop()
    for arguments, kind, message in cases:
        with pytest.raises(kind) as raised:
            shoal.fit(model=local_network(), run_dir=tmp_path / "run", **arguments, **SETTINGS)
        assert str(raised.value).startswith(message) and "shoal-data" not in str(raised.value)
        assert not (tmp_path / "run").exists(), message
        assert "shoal worker" not in capfd.readouterr().err  # no worker started to fail on it
