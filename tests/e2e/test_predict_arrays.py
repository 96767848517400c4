"""`shoal.predict` takes rows held in memory (an array, a tensor, or features with labels) as it takes a
dataset folder, with the same answers; anything else is refused in one line saying what is accepted, and
errors name the array, never the temporary folder it was written to."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import shoal
from shoal.data.format import open_dataset
from shoal.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def trained(small_run):
    run_dir, test = small_run
    features, labels = next(open_dataset(str(test)).iter_rows(0, 200, max_rows=200))[1:]
    return run_dir, test, features, labels


def test_an_array_is_predicted_as_the_same_rows_in_a_folder_are(trained, tmp_path):
    run_dir, test, features, labels = trained
    assert shoal.predict(run_dir, str(test), tmp_path / "folder.parquet") == 200
    assert shoal.predict(run_dir, features.astype(np.float64), tmp_path / "array.parquet", workers=2) == 200
    assert shoal.predict(run_dir, (torch.from_numpy(features), labels), tmp_path / "pair.parquet") == 200
    folder, array, pair = (pq.read_table(tmp_path / f"{name}.parquet") for name in ("folder", "array", "pair"))
    assert array.column_names == ["prediction", "probability_no", "probability_yes"]
    assert pair.column_names == folder.column_names
    assert array.column("prediction").to_pylist() == folder.column("prediction").to_pylist()
    assert pair.column("label").to_pylist() == folder.column("label").to_pylist()
    assert np.allclose(array.column("probability_yes").to_numpy(), folder.column("probability_yes").to_numpy())


@pytest.mark.parametrize(("data", "error", "message"), [
    ({"x": 1}, ConfigError, "dataset: got a dict; expected a dataset folder, an array or tensor of features"),
    ((np.zeros((3, 20)),), ConfigError, "dataset: a tuple of 1; expected a dataset folder"),
    ((np.zeros((3, 20)), np.zeros(2)), ConfigError, "labels: 2 rows, but features has 3"),
    (np.zeros((3, 5)), DataError, r"features: does not match the model's training set .*sample shape \[5\]"),
    (np.full((3, 20), np.nan), DataError, "features: row .* holds a non-finite feature"),
])
def test_other_data_is_refused_in_one_line_naming_the_array(trained, tmp_path, data, error, message):
    run_dir = trained[0]
    with pytest.raises(error, match=message) as refused:
        shoal.predict(run_dir, data, tmp_path / "out.parquet")
    assert "\n" not in str(refused.value) and "shoal-predict" not in str(refused.value)
    assert not list(tmp_path.iterdir())
