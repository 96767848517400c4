"""Importers: exact round trips for LIBSVM, CSV and NumPy sources, and clean failures.

IDX, HDF5, Parquet, one-hot encoding, the command line and memory have their own
`test_import_*.py` files, which share this file's helpers.

Every failure case checks the message (file, and line where there is one) and that neither the
output folder nor the writer's temporary folder is left behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from shoal.data.format import DatasetWriter, open_dataset
from shoal.data.importers import common, csv_format, import_dataset, libsvm
from shoal.errors import DataError


def assert_nothing_left(out: Path) -> None:
    assert not out.exists(), f"{out} was left behind"
    leftovers = [name for name in os.listdir(out.parent) if name.startswith(f".{out.name}.") and name.endswith(".tmp")]
    assert leftovers == [], f"temporary folders left behind: {leftovers}"


def import_fails(source: Path, out: Path, format: str, match: str | None, **options) -> DataError:
    with pytest.raises(DataError, match=match) as caught:
        import_dataset(str(source), str(out), format, **options)
    assert_nothing_left(out)
    return caught.value


def read_back(out: Path) -> tuple[np.ndarray, np.ndarray, list]:
    """Features, raw labels (mapped back through the classes) and the classes of a dataset."""
    dataset = open_dataset(str(out))
    features, indices = dataset.read_all()
    labels = indices if dataset.classes is None else np.asarray(dataset.classes)[indices]
    return features, labels, dataset.classes


def record_writes(monkeypatch) -> list[int]:
    """Spy on `DatasetWriter.write`: the row counts of the chunks an importer hands over."""
    sizes: list[int] = []
    original = DatasetWriter.write

    def write(self, features, labels):
        sizes.append(len(features))
        original(self, features, labels)

    monkeypatch.setattr(DatasetWriter, "write", write)
    return sizes


# LIBSVM ------------------------------------------------------------------------------------

LIBSVM_TEXT = """\
# a comment line
+1 1:0.5 3:2 # a trailing comment
-1 2:-1.25

+1
-1 1:1e-3 2:4 3:-7
"""
LIBSVM_FEATURES = np.array([[0.5, 0, 2], [0, -1.25, 0], [0, 0, 0], [1e-3, 4, -7]], dtype=np.float32)
LIBSVM_LABELS = np.array([1, -1, 1, -1])


def test_libsvm_round_trip(tmp_path):
    source = tmp_path / "small.svm"
    source.write_text(LIBSVM_TEXT)
    dataset = import_dataset(str(source), str(tmp_path / "out"), "libsvm")
    assert dataset.rows == 4 and dataset.shape == (3,) and dataset.feature_dtype == np.float32
    assert dataset.classes == [-1, 1]
    assert dataset.meta["source"]["format"] == "libsvm"
    features, labels, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, LIBSVM_FEATURES)
    np.testing.assert_array_equal(labels, LIBSVM_LABELS)


def test_libsvm_explicit_feature_count_pads_with_zeros(tmp_path):
    source = tmp_path / "small.svm"
    source.write_text(LIBSVM_TEXT)
    import_dataset(str(source), str(tmp_path / "out"), "libsvm", n_features=5)
    features, _, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, np.pad(LIBSVM_FEATURES, ((0, 0), (0, 2))))


def test_libsvm_streams_in_chunks_and_settles_one_label_type(tmp_path, monkeypatch):
    # Integer labels in the first chunks and a fractional one in the last: all become floats.
    lines = [f"{row % 3} {row % 7 + 1}:{row}" for row in range(25)] + ["2.5 1:1"]
    source = tmp_path / "many.svm"
    source.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(libsvm, "LIBSVM_CHUNK_LINES", 4)
    sizes = record_writes(monkeypatch)
    import_dataset(str(source), str(tmp_path / "out"), "libsvm", n_features=7)
    assert max(sizes) <= 4 and sum(sizes) == 26
    features, labels, classes = read_back(tmp_path / "out")
    assert classes is None  # fractional labels make a regression target
    np.testing.assert_array_equal(labels, [row % 3 for row in range(25)] + [2.5])
    expected = np.zeros((26, 7), dtype=np.float32)
    expected[np.arange(25), np.arange(25) % 7] = np.arange(25)
    expected[25, 0] = 1
    np.testing.assert_array_equal(features, expected)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("1 3-1", "malformed pair '3-1'"),
        ("1 1:2:3 4", "malformed pair '1:2:3'"),
        ("1 2: 3", "malformed pair '2:'"),
        ("1 x:1", "index 'x' is not an integer"),
        ("1 0:1", "index 0 is below 1"),
        ("1 9:1", "index 9 is above the feature count 4"),
        ("1 2:abc", "value 'abc' of index 2 is not a number"),
        ("yes 2:1", "label 'yes' is not a number"),
    ],
)
def test_libsvm_bad_line_names_file_and_line(tmp_path, line, problem):
    source = tmp_path / "bad.svm"
    source.write_text(f"1 1:1\n# comment\n\n{line}\n0 2:1\n")
    out = tmp_path / "out"
    error = import_fails(source, out, "libsvm", None, n_features=4)
    assert str(error).startswith(f"{source}:4: ")
    assert problem in str(error)


def test_libsvm_index_too_large_for_int64_is_named(tmp_path):
    source = tmp_path / "huge.svm"
    source.write_text("1 1:1\n0 99999999999999999999:1\n")
    import_fails(source, tmp_path / "out", "libsvm", f"^{source}:2: index 99999999999999999999 is above the largest")


def test_libsvm_empty_source(tmp_path):
    source = tmp_path / "empty.svm"
    source.write_text("# only a comment\n\n")
    import_fails(source, tmp_path / "out", "libsvm", "empty")


def test_a9a_imports_with_its_documented_feature_count(tmp_path, a9a_dir):
    # a9a_dir (conftest) is ../shared/data/a9a beside the project, or a skip naming it.
    source = a9a_dir / "a9a"
    dataset = import_dataset(str(source), str(tmp_path / "a9a"), "libsvm", n_features=123)
    assert dataset.rows == 32_560  # `wc -l`: one row per line, no blank lines
    assert dataset.shape == (123,)
    assert dataset.classes == [0, 1]
    features, labels = dataset.read_all()
    assert labels.sum() == 7_841  # incomes above 50K
    assert set(np.unique(features)) == {0.0, 1.0}
    assert not features[:, 122].any()  # index 123 never appears in this copy


# CSV ---------------------------------------------------------------------------------------

CSV_TEXT = "width,height,kind\n1.5,2,0\n-3,4e2,1\n\n5,6,1\n"
CSV_FEATURES = np.array([[1.5, 2], [-3, 400], [5, 6]], dtype=np.float32)


def test_csv_round_trip_with_default_label(tmp_path):
    source = tmp_path / "small.csv"
    source.write_text(CSV_TEXT)
    dataset = import_dataset(str(source), str(tmp_path / "out"), "csv")
    assert dataset.feature_names == ["width", "height"]
    assert dataset.classes == [0, 1]
    features, labels, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, CSV_FEATURES)
    np.testing.assert_array_equal(labels, [0, 1, 1])


@pytest.mark.parametrize("label", ["width", "0", "-3"])
def test_csv_label_by_name_or_position(tmp_path, label):
    source = tmp_path / "small.csv"
    source.write_text(CSV_TEXT)
    dataset = import_dataset(str(source), str(tmp_path / "out"), "csv", label=label)
    assert dataset.feature_names == ["height", "kind"]
    features, labels, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, [[2, 0], [400, 1], [6, 1]])
    np.testing.assert_array_equal(labels, [1.5, -3, 5])  # fractional: a regression target


def test_csv_text_labels(tmp_path):
    source = tmp_path / "animals.csv"
    source.write_text("a,b,animal\n1,2,cat\n3,4,dog\n5,6,cat\n")
    dataset = import_dataset(str(source), str(tmp_path / "out"), "csv")
    assert dataset.classes == ["cat", "dog"]
    _, labels, _ = read_back(tmp_path / "out")
    assert labels.tolist() == ["cat", "dog", "cat"]


def test_csv_streams_blocks_and_settles_one_label_type(tmp_path, monkeypatch):
    rows = 2_000
    features = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) / 4
    labels = [str(row % 2) for row in range(rows - 1)] + ["+1"]
    lines = ["a,b,c,label"] + [
        ",".join(f"{value:g}" for value in row) + f",{label}" for row, label in zip(features, labels)
    ]
    source = tmp_path / "big.csv"
    source.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(csv_format, "CSV_BLOCK_BYTES", 4096)
    sizes = record_writes(monkeypatch)
    import_dataset(str(source), str(tmp_path / "out"), "csv", n_features=3)
    assert len(sizes) > 5 and sum(sizes) == rows
    read_features, read_labels, classes = read_back(tmp_path / "out")
    assert classes == [0, 1]
    np.testing.assert_array_equal(read_features, features)
    np.testing.assert_array_equal(read_labels, [row % 2 for row in range(rows - 1)] + [1])


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("a,b,y\n1,2,0\n\n3,x,1\n", 4,
         "column 'b' holds 'x', which is not a number (if 'b' is categorical, declare it: --categorical b)"),
        ("a,b,y\n1,2,0\n3,,1\n", 3, "column 'b' is empty"),
        ("a,b,y\n1,2,0\n3,4\n5,6,1\n", 3, "has 2 fields, but the header has 3"),
        ("a,b,y\n1,2,0\n3,4,1,7\n", 3, "has 4 fields, but the header has 3"),
        ("a,b,y\n1,2,0\n3,4,\n", 3, "the label column 'y' is empty"),
    ],
)
def test_csv_bad_row_names_file_and_line(tmp_path, text, line, problem):
    source = tmp_path / "bad.csv"
    source.write_text(text)
    error = import_fails(source, tmp_path / "out", "csv", None)
    assert str(error) == f"{source}:{line}: {problem}"


def test_csv_bad_value_far_into_the_file(tmp_path, monkeypatch):
    lines = ["a,y"] + [f"{row},{row % 2}" for row in range(3_000)]
    lines[2_500] = "oops,1"
    source = tmp_path / "late.csv"
    source.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(csv_format, "CSV_BLOCK_BYTES", 2048)
    import_fails(source, tmp_path / "out", "csv", f"^{source}:2501: column 'a' holds 'oops'")


def test_csv_missing_label_column(tmp_path):
    source = tmp_path / "small.csv"
    source.write_text(CSV_TEXT)
    import_fails(source, tmp_path / "out", "csv", f"^{source}: label column 'price' not found", label="price")


def test_csv_feature_count_mismatch(tmp_path):
    source = tmp_path / "small.csv"
    source.write_text(CSV_TEXT)
    import_fails(source, tmp_path / "out", "csv", f"^{source}: has 2 feature columns, but n_features=3", n_features=3)


def test_csv_without_rows_or_header(tmp_path):
    header_only = tmp_path / "header.csv"
    header_only.write_text("a,b,y\n")
    import_fails(header_only, tmp_path / "out", "csv", "empty")
    nothing = tmp_path / "nothing.csv"
    nothing.write_text("")
    import_fails(nothing, tmp_path / "out", "csv", f"^{nothing}:1: expected a header row")


# NumPy -------------------------------------------------------------------------------------


def test_npy_images_stay_uint8_with_their_shape(tmp_path, monkeypatch):
    generator = np.random.default_rng(0)
    images = generator.integers(0, 256, size=(300, 28, 28), dtype=np.uint8)
    labels = generator.integers(0, 10, size=300)
    np.save(tmp_path / "x.npy", images)
    np.save(tmp_path / "y.npy", labels.reshape(-1, 1).astype(np.uint8))
    monkeypatch.setattr(common, "CHUNK_BYTES", 50 * 28 * 28 * 4)
    sizes = record_writes(monkeypatch)
    dataset = import_dataset(str(tmp_path / "x.npy"), str(tmp_path / "out"), "npy", label=str(tmp_path / "y.npy"))
    assert sizes == [50] * 6
    assert dataset.shape == (28, 28) and dataset.feature_dtype == np.uint8
    features, read_labels, classes = read_back(tmp_path / "out")
    assert classes == sorted(set(labels.tolist()))
    np.testing.assert_array_equal(features, images)
    np.testing.assert_array_equal(read_labels, labels)


@pytest.mark.parametrize("dtype", [np.float64, np.int16, np.float32, np.bool_])
def test_npy_numbers_become_float32(tmp_path, dtype):
    values = (np.arange(40).reshape(10, 4) % 3).astype(dtype)
    np.save(tmp_path / "x.npy", values)
    np.save(tmp_path / "y.npy", np.array([-1, 1] * 5))
    dataset = import_dataset(str(tmp_path / "x.npy"), str(tmp_path / "out"), "npy", label=str(tmp_path / "y.npy"))
    assert dataset.feature_dtype == np.float32 and dataset.shape == (4,)
    features, labels, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, values.astype(np.float32))
    np.testing.assert_array_equal(labels, [-1, 1] * 5)


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_round_trip(tmp_path, monkeypatch, save):
    generator = np.random.default_rng(1)
    x = generator.standard_normal((257, 3, 5))
    y = np.array(["even", "odd"])[np.arange(257) % 2]
    save(tmp_path / "data.npz", x=x, y=y, extra=np.zeros(3))
    monkeypatch.setattr(common, "CHUNK_BYTES", 100 * 15 * 8)
    sizes = record_writes(monkeypatch)
    dataset = import_dataset(str(tmp_path / "data.npz"), str(tmp_path / "out"), "npy", label="ignored")
    assert sizes == [100, 100, 57]
    assert dataset.shape == (3, 5) and dataset.classes == ["even", "odd"]
    features, labels, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, x.astype(np.float32))
    np.testing.assert_array_equal(labels, y)


def test_npz_format_takes_only_an_archive(tmp_path):
    x, y = np.arange(12, dtype=np.float32).reshape(4, 3), np.array([2, 0, 2, 0])
    np.savez(tmp_path / "data.npz", x=x, y=y)
    import_dataset(str(tmp_path / "data.npz"), str(tmp_path / "out"), "npz")
    features, labels, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, x)
    np.testing.assert_array_equal(labels, y)
    np.save(tmp_path / "x.npy", x)
    import_fails(tmp_path / "x.npy", tmp_path / "other", "npz", f"^{tmp_path / 'x.npy'}: not a .npz archive")


def test_npy_length_mismatch_names_both_files(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((10, 2)))
    np.save(tmp_path / "y.npy", np.zeros(9))
    source, labels = tmp_path / "x.npy", tmp_path / "y.npy"
    import_fails(
        source, tmp_path / "out", "npy", f"^{source} has 10 samples but {labels} has 9 labels", label=str(labels)
    )


def test_npz_length_mismatch_and_missing_arrays(tmp_path):
    np.savez(tmp_path / "short.npz", x=np.zeros((10, 2)), y=np.zeros(11))
    import_fails(tmp_path / "short.npz", tmp_path / "out", "npy", "x has 10 samples but y has 11 labels")
    np.savez(tmp_path / "other.npz", features=np.zeros((10, 2)), y=np.zeros(10))
    import_fails(tmp_path / "other.npz", tmp_path / "out", "npy", "needs arrays 'x' and 'y'; it holds features, y")


def test_npy_needs_labels_and_a_matching_feature_count(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((10, 2, 3)))
    np.save(tmp_path / "y.npy", np.zeros(10))
    source = tmp_path / "x.npy"
    import_fails(source, tmp_path / "out", "npy", "needs its labels")
    import_fails(
        source, tmp_path / "out", "npy", f"^{tmp_path / 'nope.npy'}: file not found", label=str(tmp_path / "nope.npy")
    )
    import_fails(
        source, tmp_path / "out", "npy", "6 features .*n_features=7", label=str(tmp_path / "y.npy"), n_features=7
    )


# Any format --------------------------------------------------------------------------------


def test_unknown_format_lists_the_supported_ones(tmp_path):
    source = tmp_path / "data.tiff"
    source.write_text("")
    import_fails(source, tmp_path / "out", "tiff",
                 "unknown import format 'tiff'; supported formats: csv, libsvm, idx, npy, npz, hdf5, parquet")


@pytest.mark.parametrize("format", ["libsvm", "csv", "npy"])
def test_missing_source_is_named(tmp_path, format):
    source = tmp_path / "absent.data"
    import_fails(source, tmp_path / "out", format, f"^{source}: file not found")


def test_existing_output_needs_overwrite(tmp_path):
    source = tmp_path / "small.svm"
    source.write_text(LIBSVM_TEXT)
    out = tmp_path / "out"
    import_dataset(str(source), str(out), "libsvm")
    with pytest.raises(DataError, match="already exists"):
        import_dataset(str(source), str(out), "libsvm", n_features=4)
    dataset = import_dataset(str(source), str(out), "libsvm", n_features=4, overwrite=True)
    assert dataset.shape == (4,)
    assert [name for name in os.listdir(tmp_path) if name.endswith(".tmp")] == []


def test_row_groups_stay_within_the_byte_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "ROW_GROUP_BYTES", 10 * 6 * 4)  # ten rows of six float32
    np.save(tmp_path / "x.npy", np.ones((35, 6)))
    np.save(tmp_path / "y.npy", np.zeros(35, dtype=np.int64))
    dataset = import_dataset(str(tmp_path / "x.npy"), str(tmp_path / "out"), "npy", label=str(tmp_path / "y.npy"))
    assert [info.row_groups for info in dataset.files] == [(10, 10, 10, 5)]


def test_rows_per_file_splits_the_output(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(50, dtype=np.float32).reshape(25, 2))
    np.save(tmp_path / "y.npy", np.arange(25) % 2)
    dataset = import_dataset(
        str(tmp_path / "x.npy"), str(tmp_path / "out"), "npy", label=str(tmp_path / "y.npy"), rows_per_file=10
    )
    assert [info.rows for info in dataset.files] == [10, 10, 5]
    features, _, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, np.arange(50).reshape(25, 2))
