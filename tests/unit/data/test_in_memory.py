"""Data held in memory, written to a dataset folder for `shoal.fit`: what it refuses before any worker
starts, in one line naming the argument and the row (counted from 1), never the folder it writes to."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from shoal.data.in_memory import write_in_memory
from shoal.errors import ConfigError, DataError, ShoalError, WorkerError
from shoal.fit_inputs import datasets_on_disk

ROWS = 40


def arrays(rows: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    features = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    return features, np.arange(rows) % 2


class Items:
    """A map-style Dataset of (features, label) items, each label as `label(index)` makes it."""

    def __init__(self, label):
        self.label = label

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, index: int):
        return torch.full((3,), float(index)), self.label(index)


def test_a_label_of_several_elements_is_refused_naming_the_item(tmp_path):
    # cutting it to its first element would train on another label than the one given
    with pytest.raises(ConfigError) as refused:
        write_in_memory(Items(lambda index: torch.tensor([index % 2] * (2 if index == 7 else 1))),
                        str(tmp_path / "out"), "train")
    assert str(refused.value) == ("train: row 8 (index 7): label has 2 elements, shape (2,); expected one value "
                                  "(a class or a number)")  # rows counted from 1, as a NaN's row is
    assert not (tmp_path / "out").exists()


def test_labels_of_one_element_each_are_kept_whole(tmp_path):
    dataset = write_in_memory(Items(lambda index: torch.tensor([index % 3])), str(tmp_path / "out"), "train")
    assert dataset.classes == [0, 1, 2] and list(dataset.read_all()[1][:4]) == [0, 1, 2, 0]


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_non_finite_feature_names_the_argument_and_the_row_from_one(tmp_path, value):
    features, labels = arrays()
    features[12, 1] = value
    with pytest.raises(DataError) as refused:
        write_in_memory((features, labels), str(tmp_path / "out"), "train")
    assert str(refused.value) == (f"train: row 13 (index 12) of the features holds a non-finite value ({value}): "
                                  "fix or drop it before fit")
    assert not (tmp_path / "out").exists()


def test_a_nan_label_is_refused_not_read_as_a_regression_target(tmp_path):
    features, labels = arrays()
    labels = labels.astype(np.float32)
    labels[30] = np.nan
    with pytest.raises(DataError, match=r"^test: row 31 \(index 30\) of the labels holds a non-finite value"):
        write_in_memory((features, labels), str(tmp_path / "out"), "test")


def test_a_torch_dataset_item_with_a_nan_is_named_by_its_row(tmp_path):
    class WithNan(Items):
        def __getitem__(self, index: int):
            features, label = super().__getitem__(index)
            return (features * float("nan") if index == 5 else features), label

    with pytest.raises(DataError, match=r"^train: row 6 \(index 5\) of the features holds a non-finite value"):
        write_in_memory(WithNan(lambda index: index % 2), str(tmp_path / "out"), "train")


def test_a_test_set_takes_the_training_classes_and_refuses_others(tmp_path):
    train = write_in_memory(arrays(), str(tmp_path / "train"), "train")
    features, _ = arrays(10)
    fewer = write_in_memory((features, np.zeros(10, dtype=np.int64)), str(tmp_path / "fewer"), "test",
                            encoding_from=str(train.path))
    assert fewer.classes == [0, 1]  # a test set holding one class still has the training set's two
    labels = np.zeros(10, dtype=np.int64)
    labels[8] = 5
    with pytest.raises(DataError) as refused:
        write_in_memory((features, labels), str(tmp_path / "other"), "test", encoding_from=str(train.path))
    assert str(refused.value) == "test: row 9 (index 8) has label 5, which is not one of the training labels [0, 1]"


def test_errors_inside_fit_name_the_argument_not_the_temporary_folder():
    with pytest.raises(ShoalError) as refused, datasets_on_disk({}, arrays(), None, None) as table:
        raise DataError(f"data.train: {table['data']['train']} has 40 rows; "
                        f"{table['data']['train']}/part-00000.parquet: bad")
    assert str(refused.value) == ("data.train: the train data given to fit has 40 rows; "
                                  "the train data given to fit: bad")


@pytest.mark.parametrize(("column", "what"), [
    (pd.Categorical(["a", "b"] * (ROWS // 2)), "categories (category"),
    (["a", "b"] * (ROWS // 2), "text ("),  # object or str, as the pandas version stores text
])
def test_a_frame_with_a_text_or_category_column_says_to_encode_it(tmp_path, column, what):
    features, labels = arrays()
    frame = pd.DataFrame(features, columns=["x", "y", "z"]).assign(color=column, outcome=labels)
    with pytest.raises(ConfigError) as refused:
        write_in_memory(frame, str(tmp_path / "out"), "train", label="outcome")
    message = str(refused.value)
    assert message.startswith(f"train: column 'color' holds {what}")
    assert message.endswith("), not numbers: encode it before fit, "
                            "e.g. pandas.get_dummies(frame, columns=['color'], dtype=float)")
    assert "--categorical" not in str(refused.value)


def test_a_frame_with_a_text_label_column_is_fine(tmp_path):
    features, labels = arrays()
    frame = pd.DataFrame(features, columns=["x", "y", "z"]).assign(outcome=np.where(labels, "yes", "no"))
    assert write_in_memory(frame, str(tmp_path / "out"), "train", label="outcome").classes == ["no", "yes"]


def test_a_frame_with_an_infinity_is_refused_naming_the_column_and_row(tmp_path):
    features, labels = arrays()
    features[20, 2] = -np.inf
    frame = pd.DataFrame(features, columns=["x", "y", "z"]).assign(outcome=labels)
    with pytest.raises(DataError) as refused:
        write_in_memory(frame, str(tmp_path / "out"), "train", label="outcome")
    assert str(refused.value) == ("train: row 21 (position 20) of column 'z' holds an infinite value: "
                                  "fix or drop it before fit")


def test_items_that_are_no_pair_or_differ_in_shape_are_named_by_rows_from_one(tmp_path):
    class Odd(Items):
        def __getitem__(self, index: int):
            features, label = super().__getitem__(index)
            return features if index == 3 else (features, label)

    with pytest.raises(ConfigError, match=r"^train: row 4 \(index 3\) is not a \(features, label\) pair$"):
        write_in_memory(Odd(lambda index: 0), str(tmp_path / "out"), "train")

    class Ragged(Items):
        def __getitem__(self, index: int):
            features, label = super().__getitem__(index)
            return (features[:2] if index == 9 else features), label

    with pytest.raises(ConfigError, match=r"^train: rows 1 to 40 \(indices 0 to 39\) differ in shape"):
        write_in_memory(Ragged(lambda index: 0), str(tmp_path / "out"), "train")


def test_a_failed_job_inside_fit_names_the_argument_not_the_temporary_folder():
    with pytest.raises(WorkerError) as failed, datasets_on_disk({}, arrays(), None, None) as table:
        raise WorkerError(f"worker rank 0 on h failed: DataError: {table['data']['train']}/part-0.parquet: bad row")
    assert str(failed.value) == "worker rank 0 on h failed: DataError: the train data given to fit: bad row"
