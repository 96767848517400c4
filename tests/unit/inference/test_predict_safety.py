"""`shoal predict` replaces no file unasked, never writes into the run directory, and refuses a dataset
whose rows are not like the training set's (dtype, shape, feature names, one-hot encoding)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from shoal.cli import main
from shoal.data.compatible import TRAINING, first_difference, schema
from shoal.data.format import DatasetWriter, open_dataset
from shoal.errors import DataError, ShoalError
from shoal.inference.predictions import predict
from shoal.run.artifacts import load_artifact, save_model

NAMES = ["age", "income", "height"]


@pytest.fixture(autouse=True)
def quiet_environment(monkeypatch):
    """`shoal.cli.main` sets TORCH_CPP_LOG_LEVEL for its workers; the test's environment is put back after."""
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "ERROR")


def write_dataset(path: Path, dtype: str = "float32", names: list[str] | None = NAMES, shape=(3,),
                  encoding: dict | None = None) -> Path:
    features = np.random.default_rng(0).integers(0, 200, size=(30, *shape)).astype(dtype)
    extra = {"encoding": encoding} if encoding else None
    with DatasetWriter(str(path), shape, dtype, feature_names=names, extra_meta=extra) as writer:
        writer.write(features, np.arange(30) % 2)
    return path


@pytest.fixture
def run(tmp_path) -> Path:
    """A finished run trained on float32 rows with three named features."""
    train = open_dataset(str(write_dataset(tmp_path / "train")))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_model(run_dir, nn.Sequential(nn.Linear(3, 2)), {"input": [3], "layers": [{"dense": 2}]},
               "cross_entropy", train.classes, "float32", training_set=train)
    return run_dir


# ---------------------------------------------------------------- the output file


def test_an_existing_file_is_replaced_only_with_overwrite(run, tmp_path, capsys):
    data, out = write_dataset(tmp_path / "data"), tmp_path / "predictions.parquet"
    out.write_text("keep me")
    with pytest.raises(ShoalError) as caught:
        predict(run, str(data), out)
    assert str(caught.value) == f"{out}: already exists; pass --overwrite (overwrite=True) to replace it"
    assert main(["predict", str(run), str(data), "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"shoal: error: {caught.value}\n"
    assert out.read_text() == "keep me"
    assert main(["predict", str(run), str(data), "--out", str(out), "--overwrite"]) == 0
    assert pq.read_table(out).num_rows == 30
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data", "predictions.parquet", "run", "train"]


def test_the_runs_own_model_is_never_replaced_even_with_overwrite(run, tmp_path, capsys):
    data, model = write_dataset(tmp_path / "data"), run / "model.pt"
    before = model.read_bytes()
    assert main(["predict", str(run), str(data), "--out", str(model), "--overwrite"]) == 2
    assert capsys.readouterr().err == (f"shoal: error: {model}: inside the run directory {run}; write predictions "
                                       "elsewhere (a run's files are never replaced, --overwrite or not)\n")
    assert model.read_bytes() == before


def test_no_new_file_goes_into_the_run_directory_either(run, tmp_path):
    data = write_dataset(tmp_path / "data")
    linked = tmp_path / "linked.csv"
    linked.symlink_to(run / "predictions.csv")  # a path outside that leads inside
    for out in (run / "predictions.csv", linked):
        with pytest.raises(ShoalError, match=f"inside the run directory {run};"):
            predict(run, str(data), out, overwrite=True)
    assert sorted(path.name for path in run.iterdir()) == ["model.pt"]


# ---------------------------------------------------------------- the dataset against the training set


def test_model_pt_records_what_the_training_set_looked_like(run):
    stored = load_artifact(run)["training_set"]
    assert stored == {"feature_dtype": "float32", "shape": [3], "feature_names": NAMES, "encoding": None,
                      "classes": [0, 1]}


def test_a_uint8_dataset_on_a_float32_model_is_refused(run, tmp_path, capsys):
    data, out = write_dataset(tmp_path / "pixels", dtype="uint8"), tmp_path / "predictions.parquet"
    assert main(["predict", str(run), str(data), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"shoal: error: {data}: does not match the model's training set "
                                       f"({run / 'model.pt'}): features are uint8, not float32\n")
    assert not out.exists()


def test_a_dataset_with_other_feature_names_is_refused(run, tmp_path):
    data = write_dataset(tmp_path / "other", names=["age", "weight", "height"])
    with pytest.raises(DataError) as caught:
        predict(run, str(data), tmp_path / "predictions.parquet")
    assert str(caught.value) == (f"{data}: does not match the model's training set ({run / 'model.pt'}): "
                                 "feature 1 is 'weight', not 'income'")
    unnamed = write_dataset(tmp_path / "unnamed", names=None)
    with pytest.raises(DataError, match="it has no feature names, where 'age', 'income', 'height' were expected"):
        predict(run, str(unnamed), tmp_path / "predictions.parquet")


def test_a_dataset_of_another_shape_is_refused(run, tmp_path):
    data = write_dataset(tmp_path / "grid", names=None, shape=(3, 1))
    with pytest.raises(DataError, match=r"does not match .*: sample shape \[3, 1\], not \[3\]$"):
        predict(run, str(data), tmp_path / "predictions.parquet")


def test_one_hot_encodings_are_compared(tmp_path):
    encoding = {"label": "fraud", "columns": ["state", "age"], "categories": {"state": ["CA", "NY"]}}
    names = ["state=CA", "state=NY", "age"]
    train = open_dataset(str(write_dataset(tmp_path / "train", names=names, encoding=encoding)))
    other = {"label": "fraud", "columns": ["state", "age"], "categories": {"state": ["CA", "TX"]}}
    recoded = open_dataset(str(write_dataset(tmp_path / "recoded", names=["state=CA", "state=TX", "age"],
                                             encoding=other)))
    assert first_difference(schema(train), recoded) == "feature 1 is 'state=TX', not 'state=NY'"
    relabeled = open_dataset(str(write_dataset(tmp_path / "relabeled", names=names,
                                               encoding={**encoding, "categories": {"state": ["CA", "NY", "TX"]}})))
    assert first_difference(schema(train), relabeled) == ("column 'state' is one-hot encoded with categories "
                                                          "'CA', 'NY', 'TX', not 'CA', 'NY'")
    same = open_dataset(str(write_dataset(tmp_path / "same", names=names, encoding={**encoding, "label": "y"})))
    assert first_difference(schema(train), same) is None  # the label column's name does not reach the model


def test_a_test_set_is_compared_with_its_training_set_classes_included(tmp_path):
    train = open_dataset(str(write_dataset(tmp_path / "train")))
    features = np.zeros((4, 3), dtype=np.float32)
    with DatasetWriter(str(tmp_path / "test"), (3,), "float32", feature_names=NAMES) as writer:
        writer.write(features, np.array([0, 1, 2, 2]))
    test = open_dataset(str(tmp_path / "test"))
    assert first_difference(schema(train), test) is None
    assert first_difference(schema(train), test, TRAINING) == "classes [0, 1, 2], not [0, 1]"


def test_an_older_model_file_still_predicts_checking_what_it_records(tmp_path):
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    state = nn.Sequential(nn.Linear(3, 2)).state_dict()
    torch.save({"spec": {"input": [3], "layers": [{"dense": 2}]}, "state_dict": state, "loss": "cross_entropy",
                "classes": [0, 1], "feature_dtype": "float32"}, run_dir / "model.pt")
    data, out = write_dataset(tmp_path / "renamed", names=["x", "y", "z"]), tmp_path / "predictions.csv"
    assert predict(run_dir, str(data), out) == 30  # no names recorded: none compared
    assert out.read_text().splitlines()[0] == '"prediction","probability_0","probability_1","label"'
    pixels = write_dataset(tmp_path / "pixels", dtype="uint8")
    with pytest.raises(DataError, match="features are uint8, not float32$"):
        predict(run_dir, str(pixels), tmp_path / "other.csv")
