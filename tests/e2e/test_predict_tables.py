"""New rows from a table, imported without labels as the training set was encoded, are predicted as the
same rows with their labels are; rows encoded otherwise are refused."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

import shoal
from shoal.data.importers import import_dataset
from shoal.errors import DataError

KINDS = ("a", "b", "c")


def write_table(path, rows: int, seed: int, columns=("x", "kind", "y", "label"), kinds=KINDS) -> None:
    """Two numbers and a category; the label is whether x + y, shifted by the category, is positive."""
    generator = np.random.default_rng(seed)
    x, y = generator.normal(size=rows), generator.normal(size=rows)
    kind = generator.choice(kinds, size=rows)
    shift = np.array([{"a": -1.0, "b": 0.0, "c": 1.0}[value] for value in kind])
    values = {"x": x, "y": y, "kind": kind, "label": np.where(x + y + shift > 0, "yes", "no")}
    lines = [",".join(columns)] + [",".join(str(values[name][row]) for name in columns) for row in range(rows)]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tables")
    write_table(folder / "train.csv", 2000, seed=1)
    train = import_dataset(folder / "train.csv", folder / "train", "csv", categorical=["kind"])
    job = {"model": {"layers": [{"dense": 16, "activation": "relu"}, {"dense": 2}]},
           "data": {"train": train.path},
           "train": {"epochs": 3, "batch_size": 32, "optimizer": {"name": "adam", "lr": 0.01}},
           "output": {"progress": "none"}, "checkpoint": {"every": 0}}
    return folder, shoal.fit(job, workers=1, run_dir=folder / "run").run_dir


def test_unlabeled_rows_encoded_as_the_training_set_are_predicted_as_the_labeled_ones(trained, tmp_path):
    folder, run_dir = trained
    write_table(tmp_path / "test.csv", 300, seed=2)
    write_table(tmp_path / "new.csv", 300, seed=2, columns=("y", "kind", "x"))  # the same rows, no label
    labeled = import_dataset(tmp_path / "test.csv", tmp_path / "test", "csv", encoding_from=str(folder / "train"))
    new = import_dataset(tmp_path / "new.csv", tmp_path / "new", "csv", unlabeled=True,
                         encoding_from=str(folder / "train"))
    shoal.predict(run_dir, labeled.path, tmp_path / "labeled.parquet")
    shoal.predict(run_dir, new.path, tmp_path / "new.parquet")
    with_labels, without = pq.read_table(tmp_path / "labeled.parquet"), pq.read_table(tmp_path / "new.parquet")
    assert without.column_names == ["prediction", "probability_no", "probability_yes"]
    assert without.column("prediction").to_pylist() == with_labels.column("prediction").to_pylist()
    probability = [table.column("probability_yes").to_numpy() for table in (without, with_labels)]
    assert np.array_equal(*probability)
    accuracy = np.mean(np.array(with_labels.column("prediction").to_pylist())
                       == np.array(with_labels.column("label").to_pylist()))
    assert accuracy > 0.9, accuracy  # a model that learned the rule, not one that predicts a constant


def test_unlabeled_rows_encoded_their_own_way_are_refused(trained, tmp_path):
    folder, run_dir = trained
    write_table(tmp_path / "new.csv", 50, seed=3, columns=("x", "kind", "y"), kinds=("a", "c"))
    new = import_dataset(tmp_path / "new.csv", tmp_path / "new", "csv", unlabeled=True, categorical=["kind"])
    with pytest.raises(DataError, match="does not match the model's training set") as refused:
        shoal.predict(run_dir, new.path, tmp_path / "new.parquet")
    assert "\n" not in str(refused.value) and not (tmp_path / "new.parquet").exists()
