"""A Hugging Face `datasets.Dataset` given to `shoal.fit`, written to the dataset folder its workers read:
the columns as a DataFrame's (numbers in a row, or one column of arrays as the sample), in the Dataset's own
row order and format, and what it refuses in one line naming the argument and the row."""

from __future__ import annotations

import numpy as np
import pytest

from shoal import hf_inputs
from shoal.data.format import open_dataset
from shoal.errors import ConfigError, DataError, ShoalError
from shoal.fit_inputs import datasets_on_disk, write_data

datasets = pytest.importorskip("datasets", reason="shoal.fit(train=) of a Hugging Face Dataset needs `datasets`")
ROWS = 12


def numbers(rows: int = ROWS) -> datasets.Dataset:
    """Two number columns and text labels; row i holds (i, 2i)."""
    return datasets.Dataset.from_dict({"size": [float(row) for row in range(rows)], "count": [2 * row for row in
                                       range(rows)], "label": ["odd" if row % 2 else "even" for row in range(rows)]})


def pictures(rows: int = ROWS) -> datasets.Dataset:
    """One column of 2x3 nested lists, row i filled with i, and ClassLabel labels."""
    features = datasets.Features({"pixels": datasets.Array2D((2, 3), "uint8"),
                                  "label": datasets.ClassLabel(names=["dark", "light"])})
    return datasets.Dataset.from_dict({"pixels": [np.full((2, 3), row, np.uint8) for row in range(rows)],
                                       "label": [row % 2 for row in range(rows)]}, features=features)


def written(data, tmp_path, name: str = "train", **options):
    dataset = write_data(data, str(tmp_path / name), name, options.get("label"), options.get("encoding_from"))
    features, labels = dataset.read_all()
    return dataset, features, labels


def test_number_columns_become_one_row_of_features_in_column_order(tmp_path):
    dataset, features, labels = written(numbers(), tmp_path)
    assert dataset.shape == (2,) and "fields" not in dataset.meta  # a row of features, not dict items
    np.testing.assert_array_equal(features, [[row, 2 * row] for row in range(ROWS)])
    assert [dataset.classes[label] for label in labels] == ["odd" if row % 2 else "even" for row in range(ROWS)]


def test_the_datasets_own_row_order_and_format_columns_are_read(tmp_path):
    # a shuffled or selected Dataset maps indices over its table: reading the table would give other rows
    shuffled = numbers().shuffle(seed=3).select(range(5))
    _, features, _ = written(shuffled, tmp_path)
    np.testing.assert_array_equal(features[:, 0], shuffled["size"])
    dataset, features, _ = written(numbers().with_format("torch", columns=["count", "label"]), tmp_path, "test")
    assert dataset.shape == (1,)
    np.testing.assert_array_equal(features[:, 0], [2 * row for row in range(ROWS)])


def test_label_names_another_label_column(tmp_path):
    data = numbers().rename_column("label", "kind").add_column("label", [0.5] * ROWS)
    dataset, features, labels = written(data, tmp_path, label="kind")
    assert dataset.shape == (3,) and set(dataset.classes) == {"odd", "even"}
    np.testing.assert_array_equal(features[:, 2], [0.5] * ROWS)  # the column named label is a feature here


@pytest.mark.parametrize("chunk_rows", [1000, 5])
def test_one_column_of_arrays_gives_the_sample_its_shape_chunk_by_chunk(tmp_path, monkeypatch, chunk_rows):
    monkeypatch.setattr(hf_inputs, "rows_per_chunk", lambda shape, dtype: chunk_rows)
    data = pictures().shuffle(seed=1)
    dataset, features, labels = written(data, tmp_path)
    assert dataset.shape == (2, 3) and dataset.feature_dtype == np.uint8
    order = [int(block[0][0]) for block in data["pixels"]]
    np.testing.assert_array_equal(features.reshape(ROWS, 2, 3), [np.full((2, 3), row) for row in order])
    np.testing.assert_array_equal(labels, [row % 2 for row in order])


def test_nested_lists_and_images_become_arrays(tmp_path):
    lists = datasets.Dataset.from_dict({"grid": [[[row, 1], [2, 3]] for row in range(4)], "label": [0, 1, 0, 1]})
    dataset, features, _ = written(lists, tmp_path)
    assert dataset.shape == (2, 2) and features.reshape(4, 4)[:, 0].tolist() == [0, 1, 2, 3]
    images = datasets.Dataset.from_dict({"image": [np.full((4, 5), row, np.uint8) for row in range(3)],
                                         "label": [0, 1, 0]},
                                        features=datasets.Features({"image": datasets.Image(),
                                                                    "label": datasets.ClassLabel(num_classes=2)}))
    dataset, features, _ = written(images, tmp_path, "test")
    # channels first, as `shoal data import --format images` stores them: one conv2d model takes either
    assert dataset.shape == (1, 4, 5) and features.reshape(3, 20)[:, 0].tolist() == [0, 1, 2]
    colour = datasets.Dataset.from_dict({"image": [np.stack([np.full((4, 5), row, np.uint8),
                                                             np.zeros((4, 5), np.uint8), np.ones((4, 5), np.uint8)],
                                                            axis=-1) for row in range(3)], "label": [0, 1, 0]},
                                        features=datasets.Features({"image": datasets.Image(),
                                                                    "label": datasets.ClassLabel(num_classes=2)}))
    dataset, features, _ = written(colour, tmp_path / "colour", "test")
    planes = features.reshape(3, 3, 4, 5)
    assert dataset.shape == (3, 4, 5) and planes[:, 0, 0, 0].tolist() == [0, 1, 2] and planes[:, 2].min() == 1


def test_a_test_set_takes_the_training_sets_encoding(tmp_path):
    train, _, _ = written(numbers(), tmp_path)
    test, features, _ = written(numbers(4).select_columns(["count", "size", "label"]), tmp_path, "test",
                                encoding_from=train.path)
    assert test.feature_names == train.feature_names and test.meta["encoding"] == train.meta["encoding"]
    np.testing.assert_array_equal(features, [[row, 2 * row] for row in range(4)])  # by name, not by place
    with pytest.raises(ConfigError, match=r"test: column 'pixels' holds arrays of shape \(2, 3\), but the train "
                                          r"data's samples have shape \(2,\)"):
        written(pictures(), tmp_path / "again", "test", encoding_from=train.path)


def with_value(column: str, row: int, value) -> datasets.Dataset:
    data = numbers().to_dict()
    data[column][row] = value
    return datasets.Dataset.from_dict(data)


def ragged() -> datasets.Dataset:
    return datasets.Dataset.from_dict({"grid": [[1, 2]] * 7 + [[1, 2, 3]], "label": [0] * 8})


def uneven_images() -> datasets.Dataset:
    sizes = [(4, 5)] * 4 + [(4, 6)] + [(4, 5)] * 3
    return datasets.Dataset.from_dict({"image": [np.zeros(size, np.uint8) for size in sizes], "label": [0] * 8},
                                      features=datasets.Features({"image": datasets.Image(),
                                                                  "label": datasets.Value("int64")}))


REFUSED = [
    (lambda: datasets.DatasetDict({"train": numbers(), "test": numbers()}),
     r"train: a DatasetDict of splits \('train', 'test'\), not one: give one split, train=dataset\['train'\]"),
    (lambda: numbers().with_transform(lambda batch: batch), "train: the Dataset has a transform"),
    (lambda: numbers().rename_column("label", "kind"), "label: train has no column 'label'; its columns are"),
    (lambda: numbers().add_column("name", ["a"] * ROWS), r"train: column 'name' holds text \(string\), not numbers"),
    (lambda: pictures().add_column("size", [1.0] * ROWS), "train: column 'pixels' holds arrays beside the columns"),
    (lambda: numbers().select_columns(["label"]), "train: holds only the label column 'label'"),
    (lambda: numbers().select([]), "train: holds no samples"),
    (ragged, r"train: row 8 \(index 7\) of column 'grid' .*3.* row 1's .*2.*: give every row's array the same"),
    (lambda: datasets.Dataset.from_dict({"grid": [[1, 2]] * 7 + [[1, None]], "label": [0] * 8}),
     r"^train: row 8 \(index 7\) of column 'grid' is empty \(null\)"),
    (uneven_images, r"train: row 5 \(index 4\) of column 'image' .*\(4, 6\).*\(4, 5\)"),
    (lambda: with_value("size", 4, None), r"train: row 5 \(index 4\) of column 'size' is empty \(null\)"),
    (lambda: with_value("size", 9, float("inf")), r"train: row 10 \(index 9\) of column 'size' holds a non-finite"),
    (lambda: with_value("label", 2, None), r"train: row 3 \(index 2\) of column 'label' is empty \(null\)"),
]


@pytest.mark.parametrize(("make", "message"), REFUSED, ids=[message[:40] for _, message in REFUSED])
@pytest.mark.parametrize("chunk_rows", [1000, 3])
def test_refusals_are_one_line_naming_the_argument(tmp_path, monkeypatch, make, message, chunk_rows):
    monkeypatch.setattr(hf_inputs, "rows_per_chunk", lambda shape, dtype: chunk_rows)
    with pytest.raises((ConfigError, DataError), match=message) as refused:
        written(make(), tmp_path)
    assert "\n" not in str(refused.value) and str(tmp_path) not in str(refused.value)
    assert not (tmp_path / "train").exists()


def test_only_the_datasets_classes_are_read_by_their_columns():
    class Dataset:  # a user's own class of that name, in a module of that name, is not a Hugging Face Dataset
        __module__ = "datasets"

    assert hf_inputs.is_hugging_face(numbers()) and hf_inputs.is_hugging_face(numbers().to_iterable_dataset())
    assert not hf_inputs.is_hugging_face(Dataset()) and not hf_inputs.is_hugging_face(numbers().to_pandas())


def test_fit_writes_train_and_test_and_names_neither_folder(tmp_path):
    with datasets_on_disk({}, numbers(), numbers(4), None) as table:
        train, test = open_dataset(table["data"]["train"]), open_dataset(table["data"]["test"])
        assert (train.rows, test.rows, test.shape) == (ROWS, 4, (2,))
    with pytest.raises(ShoalError) as refused:
        with datasets_on_disk({}, numbers(), numbers(4).rename_column("count", "other"), None):
            pass
    assert str(refused.value).startswith("test: the Dataset: lacks the feature column(s) count")
    assert "shoal-" not in str(refused.value)
