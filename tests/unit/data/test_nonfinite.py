"""NaN and infinity in a dataset: a data error naming the dataset, the Parquet file and the row,
raised when a worker loads its share and when the test set is read, not a NaN loss later."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from shoal.data.format import DatasetWriter, first_non_finite, open_dataset
from shoal.data.loader import ShardLoader
from shoal.errors import DataError

ROWS, WIDTH = 30, 5


def write(path: Path, features: np.ndarray, labels: np.ndarray, dtype: str = "float32") -> str:
    with DatasetWriter(str(path), (features.shape[1],), dtype, rows_per_file=10, row_group_size=4) as writer:
        writer.write(features, labels)
    return str(path)


def features_with(row: int, column: int, value: float, dtype: str = "float32") -> np.ndarray:
    features = np.arange(ROWS * WIDTH, dtype=dtype).reshape(ROWS, WIDTH)
    features[row, column] = value
    return features


def classes() -> np.ndarray:
    return np.arange(ROWS) % 3


def test_a_nan_feature_names_the_dataset_the_file_and_the_row(tmp_path):
    path = write(tmp_path / "set", features_with(23, 2, np.nan), classes())
    with pytest.raises(DataError) as caught:
        open_dataset(path).read_all()
    # rows count from 1, as the importers count them: the zero-based row 23 is the 24th
    assert str(caught.value) == (f"{path}/part-00002.parquet: row 24 of the dataset (row 4 of the file) holds a "
                                 "non-finite feature (nan): fix or drop it at the source and import again")


@pytest.mark.parametrize("value", [np.inf, -np.inf])
def test_an_infinite_feature_is_refused_too(tmp_path, value):
    path = write(tmp_path / "set", features_with(4, 0, value), classes())
    with pytest.raises(DataError, match=rf"part-00000\.parquet: row 5 of the dataset .* feature \({value}\)"):
        open_dataset(path).read_rows(0, 10)


def test_the_first_offending_row_is_named(tmp_path):
    features = features_with(17, 4, np.nan)
    features[12, 1] = np.inf
    path = write(tmp_path / "set", features, classes())
    with pytest.raises(DataError, match=r"part-00001\.parquet: row 13 of the dataset \(row 3 of the file\)"):
        open_dataset(path).read_all()


def test_half_precision_features_are_checked(tmp_path):
    path = write(tmp_path / "set", features_with(9, 3, np.inf, "float16"), classes(), "float16")
    with pytest.raises(DataError, match=r"row 10 of the dataset .* feature \(inf\)"):
        open_dataset(path).read_all()


def test_a_non_finite_regression_target_is_refused(tmp_path):
    targets = np.linspace(0.5, 3.5, ROWS)
    targets[27] = np.inf
    path = write(tmp_path / "set", features_with(0, 0, 1.0), targets)
    dataset = open_dataset(path)
    assert dataset.classes is None
    with pytest.raises(DataError, match=r"part-00002\.parquet: row 28 of the dataset .* non-finite label \(inf\)"):
        dataset.read_all()


def test_a_worker_loading_its_share_in_memory_refuses_it(tmp_path):
    path = write(tmp_path / "set", features_with(23, 2, np.nan), classes())
    with pytest.raises(DataError, match=r"part-00002\.parquet: row 24 of the dataset"):
        ShardLoader(open_dataset(path), rank=1, world_size=2, batch_size=4, seed=0)
    clean = ShardLoader(open_dataset(path), rank=0, world_size=2, batch_size=4, seed=0)  # rows 0..14: clean
    assert clean.rows == 15 and np.isfinite(clean.features).all()


def test_a_worker_caching_its_share_refuses_it_and_leaves_no_cache(tmp_path):
    path = write(tmp_path / "set", features_with(23, 2, -np.inf), classes())
    cache_dir = tmp_path / "cache"
    with pytest.raises(DataError, match=r"part-00002\.parquet: row 24 of the dataset .* \(-inf\)"):
        ShardLoader(open_dataset(path), rank=0, world_size=1, batch_size=2, seed=0, memory_budget=400,
                    cache_dir=str(cache_dir))
    assert os.listdir(cache_dir) == []  # neither a temporary nor a marker a later run would trust


def test_the_test_set_read_whole_is_refused(tmp_path):
    # The coordinator reads the test set with read_all: a NaN there would make every metric NaN.
    path = write(tmp_path / "test", features_with(29, 4, np.nan), classes())
    with pytest.raises(DataError, match=r"test/part-00002\.parquet: row 30 of the dataset"):
        open_dataset(path).read_all()


def test_integer_features_are_not_checked_and_load(tmp_path):
    path = write(tmp_path / "pixels", np.full((ROWS, WIDTH), 255, dtype=np.uint8), classes(), "uint8")
    features, labels = open_dataset(path).read_all()
    assert features.dtype == np.uint8 and len(labels) == ROWS


def test_copying_rows_without_training_on_them_is_still_allowed(tmp_path):
    # split and sample copy rows as they are; only reads for training refuse them
    path = write(tmp_path / "set", features_with(5, 0, np.nan), classes())
    copied = np.concatenate([block for _, block, _ in open_dataset(path).iter_rows(0, ROWS)])
    assert np.isnan(copied[5, 0]) and np.isfinite(np.delete(copied, 5, axis=0)).all()


def test_first_non_finite_finds_the_row_and_value():
    assert first_non_finite(np.ones((4, 3), dtype=np.float32)) is None
    assert first_non_finite(np.arange(12).reshape(4, 3)) is None
    values = np.ones((4, 2, 2))
    values[2, 1, 0] = -np.inf
    values[3, 0, 0] = np.nan
    assert first_non_finite(values) == (2, -np.inf)
    assert first_non_finite(np.array([1.0, np.nan]))[0] == 1
