"""The dataset folder format: write, open, read any range, and refuse broken folders with DataError."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shoal.data.format import META_FILE, DatasetWriter, column_values, open_dataset
from shoal.errors import DataError


def leftovers(parent: Path) -> list[str]:
    return sorted(name for name in os.listdir(parent) if name.endswith(".tmp"))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """57 rows of (2, 3) float64 samples with string labels, in files of 20 rows and groups of 6."""
    path = tmp_path_factory.mktemp("format") / "set"
    rng = np.random.default_rng(42)
    features = rng.normal(size=(57, 2, 3))
    labels = rng.choice(np.array(["cat", "ant", "dog", "bee"]), size=57)
    with DatasetWriter(str(path), (2, 3), "float64", rows_per_file=20, row_group_size=6) as writer:
        for lo, hi in [(0, 5), (5, 31), (31, 32), (32, 57)]:  # uneven writes cross groups and files
            writer.write(features[lo:hi], labels[lo:hi])
    return str(path), features, labels


def test_meta_describes_files_and_row_groups(written):
    path, features, labels = written
    dataset = open_dataset(path)
    assert dataset.rows == 57 and dataset.shape == (2, 3) and dataset.features == 6
    assert dataset.feature_dtype == np.float64
    assert [f.name for f in dataset.files] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert [f.rows for f in dataset.files] == [20, 20, 17]
    assert [f.row_groups for f in dataset.files] == [(6, 6, 6, 2), (6, 6, 6, 2), (6, 6, 5)]
    assert sorted(os.listdir(path)) == [META_FILE, "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    for info in dataset.files:  # meta.json agrees with the Parquet files themselves
        metadata = pq.ParquetFile(os.path.join(path, info.name)).metadata
        assert [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)] == list(info.row_groups)
    assert leftovers(Path(path).parent) == []


def test_read_all_round_trips(written):
    path, features, labels = written
    dataset = open_dataset(path)
    read, indices = dataset.read_all()
    assert read.dtype == np.float64 and read.shape == (57, 2, 3)
    np.testing.assert_array_equal(read, features)
    assert dataset.classes == ["ant", "bee", "cat", "dog"]
    assert indices.dtype == np.int64
    assert [dataset.classes[i] for i in indices] == labels.tolist()


@pytest.mark.parametrize(("start", "stop"), [(0, 1), (0, 57), (5, 6), (6, 12), (3, 25), (19, 21), (20, 40),
                                             (39, 41), (44, 57), (56, 57), (11, 11), (57, 57)])
def test_read_rows_equals_the_slice(written, start, stop):
    path, features, labels = written
    dataset = open_dataset(path)
    read, indices = dataset.read_rows(start, stop)
    assert read.shape == (stop - start, 2, 3)
    np.testing.assert_array_equal(read, features[start:stop])
    assert [dataset.classes[i] for i in indices] == labels[start:stop].tolist()


def test_read_rows_opens_only_the_groups_it_needs(written):
    dataset = open_dataset(written[0])
    dataset.read_rows(19, 27)  # last group of file 0 (rows 18-19), first two of file 1 (20-25, 26-31)
    assert dataset.opened == [("part-00000.parquet", 3), ("part-00001.parquet", 0), ("part-00001.parquet", 1)]


def test_read_rows_outside_the_dataset(written):
    dataset = open_dataset(written[0])
    for start, stop in [(-1, 3), (5, 58), (10, 9)]:
        with pytest.raises(ValueError):
            dataset.read_rows(start, stop)


def test_int_labels_map_to_sorted_classes(tmp_path):
    labels = np.array([7, 3, 3, 11, 7, 3, 11, 11, 3])
    with DatasetWriter(str(tmp_path / "ints"), (1,), "float32", row_group_size=4) as writer:
        writer.write(np.arange(9).reshape(9, 1), labels)
    dataset = open_dataset(str(tmp_path / "ints"))
    assert dataset.classes == [3, 7, 11] and dataset.num_classes == 3
    features, indices = dataset.read_all()
    np.testing.assert_array_equal(np.asarray(dataset.classes)[indices], labels)
    np.testing.assert_array_equal(indices, [1, 0, 0, 2, 1, 0, 2, 2, 0])
    np.testing.assert_array_equal(features[:, 0], np.arange(9, dtype=np.float32))


def test_non_integer_float_labels_are_a_regression_target(tmp_path):
    targets = np.array([0.5, 1.25, -3.0, 2.0])
    with DatasetWriter(str(tmp_path / "reg"), (2,), "float32") as writer:
        writer.write(np.zeros((4, 2)), targets)
    dataset = open_dataset(str(tmp_path / "reg"))
    assert dataset.classes is None and dataset.num_classes is None
    _, values = dataset.read_all()
    assert values.dtype == np.float32
    np.testing.assert_array_equal(values, targets.astype(np.float32))


def test_label_outside_the_classes(written):
    dataset = open_dataset(written[0])
    with pytest.raises(DataError) as caught:
        dataset.label_indices(np.array(["ant", "emu"], dtype=object), "somewhere.csv")
    message = str(caught.value)
    assert message.startswith("somewhere.csv: label 'emu'") and "ant" in message


@pytest.mark.parametrize("label", [0, 5, 12, -1])
def test_int_label_outside_the_classes(tmp_path, label):
    with DatasetWriter(str(tmp_path / "ints"), (1,), "float32") as writer:
        writer.write(np.zeros((3, 1)), np.array([2, 4, 10]))
    dataset = open_dataset(str(tmp_path / "ints"))
    np.testing.assert_array_equal(dataset.label_indices(np.array([10, 2, 4]), "x"), [2, 0, 1])
    with pytest.raises(DataError, match="is not one of the classes"):
        dataset.label_indices(np.array([2, label]), "x")


# ---------------------------------------------------------------- writing safely


def test_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError, match="source broke"):
        with DatasetWriter(str(target), (3,), "float32", row_group_size=2) as writer:
            writer.write(np.ones((5, 3)), np.array([0, 1, 0, 1, 0]))
            assert len(leftovers(tmp_path)) == 1  # the work happens in a hidden temporary folder
            assert leftovers(tmp_path)[0].startswith(".out.")
            raise RuntimeError("source broke")
    assert not target.exists()
    assert os.listdir(tmp_path) == []


def test_empty_write_is_refused_and_leaves_nothing(tmp_path):
    with pytest.raises(DataError, match="no rows"):
        with DatasetWriter(str(tmp_path / "empty"), (3,), "float32"):
            pass
    assert os.listdir(tmp_path) == []


def test_existing_folder_is_refused(tmp_path):
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(DataError, match="already exists"):
        DatasetWriter(str(target), (1,), "float32")
    assert os.listdir(target) == ["keep.txt"]
    assert leftovers(tmp_path) == []


def test_overwrite_replaces_the_folder(tmp_path):
    target = tmp_path / "again"
    with DatasetWriter(str(target), (1,), "float32") as writer:
        writer.write(np.zeros((4, 1)), np.array([0, 1, 0, 1]))
    with DatasetWriter(str(target), (2,), "float32", overwrite=True) as writer:
        writer.write(np.full((3, 2), 9.0), np.array(["x", "y", "x"]))
    dataset = open_dataset(str(target))
    assert dataset.rows == 3 and dataset.shape == (2,) and dataset.classes == ["x", "y"]
    np.testing.assert_array_equal(dataset.read_all()[0], np.full((3, 2), 9.0, dtype=np.float32))
    assert leftovers(tmp_path) == []


def test_folder_created_during_the_write_is_not_clobbered(tmp_path):
    target = tmp_path / "raced"
    writer = DatasetWriter(str(target), (1,), "float32")
    writer.write(np.zeros((2, 1)), np.array([0, 1]))
    target.mkdir()
    with pytest.raises(DataError, match="already exists"):
        writer.close()
    assert os.listdir(target) == []
    assert leftovers(tmp_path) == []


def test_fractional_targets_after_whole_numbers_are_refused(tmp_path):
    # Whole-number labels were already written as classes; a later fractional one cannot join them.
    with pytest.raises(DataError, match="whole numbers in the first 2 rows, fractional later"):
        with DatasetWriter(str(tmp_path / "reg"), (1,), "float32", row_group_size=2) as writer:
            writer.write(np.zeros((2, 1)), np.array([1, 2]))
            writer.write(np.zeros((2, 1)), np.array([1.5, 2.5]))
    assert list(tmp_path.iterdir()) == []


def test_fractional_targets_make_a_regression_dataset(tmp_path):
    with DatasetWriter(str(tmp_path / "reg"), (1,), "float32", row_group_size=2) as writer:
        writer.write(np.zeros((2, 1)), np.array([1.0, 2.5]))
        writer.write(np.zeros((2, 1)), np.array([1.5, 2.0]))
    dataset = open_dataset(str(tmp_path / "reg"))
    assert dataset.classes is None
    np.testing.assert_array_equal(dataset.read_all()[1], [1.0, 2.5, 1.5, 2.0])


# ---------------------------------------------------------------- opening broken folders


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small"
    with DatasetWriter(str(path), (2,), "float32", rows_per_file=5, row_group_size=5) as writer:
        writer.write(np.arange(20).reshape(10, 2), np.arange(10) % 2)
    return path


def open_error(path) -> str:
    with pytest.raises(DataError) as caught:
        open_dataset(str(path))
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_missing_folder(tmp_path):
    assert open_error(tmp_path / "absent") == f"{tmp_path / 'absent'}: dataset not found"


def test_a_file_is_not_a_dataset(tmp_path):
    (tmp_path / "data.csv").write_text("1,2\n")
    assert open_error(tmp_path / "data.csv").startswith(f"{tmp_path / 'data.csv'}: not a dataset folder")


def test_folder_without_meta(small):
    os.remove(small / META_FILE)
    assert open_error(small).startswith(f"{small}/{META_FILE}: missing")


def test_corrupt_meta_bytes(small):
    (small / META_FILE).write_bytes(b"\xff\xfe\x00garbage\x81")
    assert open_error(small).startswith(f"{small}/{META_FILE}: corrupt")


def test_meta_that_is_not_json(small):
    (small / META_FILE).write_text("{rows: 10,")
    assert open_error(small).startswith(f"{small}/{META_FILE}: corrupt")


def edit_meta(path: Path, change) -> None:
    meta = json.loads((path / META_FILE).read_text())
    change(meta)
    (path / META_FILE).write_text(json.dumps(meta))


def test_meta_rows_not_matching_the_files(small):
    edit_meta(small, lambda meta: meta.update(rows=11))
    assert open_error(small) == f"{small}/{META_FILE}: file row counts do not add up to 'rows'"


def test_meta_row_groups_not_matching_a_file(small):
    edit_meta(small, lambda meta: meta["files"][1].update(row_groups=[4]))
    message = open_error(small)
    assert message.startswith(f"{small}/{META_FILE}:") and "part-00001.parquet" in message


def test_meta_of_another_format(small):
    edit_meta(small, lambda meta: meta.update(format="other"))
    assert "not a shoal dataset" in open_error(small)
    edit_meta(small, lambda meta: meta.update(format="shoal.dataset", version=99))
    assert "unsupported format version 99" in open_error(small)


def test_meta_with_a_missing_key(small):
    edit_meta(small, lambda meta: meta.pop("shape"))
    assert "'shape'" in open_error(small)


def test_meta_file_entry_without_a_name(small):
    edit_meta(small, lambda meta: meta["files"][0].pop("name"))
    assert "meta.json" in open_error(small)


def test_truncated_parquet_file(small):
    victim = small / "part-00001.parquet"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    dataset = open_dataset(str(small))  # meta.json is intact
    features, _ = dataset.read_rows(0, 5)  # the first file still reads
    np.testing.assert_array_equal(features, np.arange(10, dtype=np.float32).reshape(5, 2))
    with pytest.raises(DataError) as caught:
        dataset.read_rows(3, 8)
    message = str(caught.value)
    assert message.startswith(f"{small}/part-00001.parquet: cannot read Parquet file")
    assert "\n" not in message


def test_missing_parquet_file(small):
    os.remove(small / "part-00000.parquet")
    with pytest.raises(DataError, match="part-00000.parquet"):
        open_dataset(str(small)).read_all()


def test_a_dataset_opens_through_a_filesystem_uri(tmp_path):
    # Any pyarrow filesystem URI works (file:// here; s3:// and hdfs:// go through the same code).
    features = np.arange(30, dtype=np.float32).reshape(10, 3)
    with DatasetWriter(str(tmp_path / "data"), (3,), "float32", row_group_size=4) as writer:
        writer.write(features, np.arange(10) % 2)
    dataset = open_dataset((tmp_path / "data").as_uri())
    got, labels = dataset.read_rows(3, 9)
    np.testing.assert_array_equal(got, features[3:9])
    np.testing.assert_array_equal(labels, (np.arange(10) % 2)[3:9])
    with pytest.raises(DataError, match="dataset not found"):
        open_dataset((tmp_path / "missing").as_uri())


def test_column_values_reads_numbers_from_the_buffer_and_the_rest_through_arrow():
    cases = [
        (pa.array(np.arange(10, dtype=np.int32)).slice(3, 4), np.arange(3, 7, dtype=np.int32)),
        (pa.array(np.array([1.5, -2.5], dtype=np.float32)), np.array([1.5, -2.5], dtype=np.float32)),
        (pa.array(np.array([7, 250], dtype=np.uint8)), np.array([7, 250], dtype=np.uint8)),
        (pa.chunked_array([pa.array([1, 2]), pa.array([3])]), np.array([1, 2, 3])),
        (pa.array(["no", "yes"]), np.array(["no", "yes"], dtype=object)),
        (pa.array([1.0, None]), np.array([1.0, np.nan])),
    ]
    for column, expected in cases:
        values = column_values(column)
        assert values.dtype == expected.dtype
        np.testing.assert_array_equal(values, expected)
