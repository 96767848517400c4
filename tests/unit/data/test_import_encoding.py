"""One-hot encoding of categorical table columns on import, and its reuse for a second file.

The expected features are built here from the rows of the test's own CSV text, one 0/1 column
per sorted category, so an encoding that drops, reorders or misplaces a category fails.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shoal.data.importers import common, csv_format, import_dataset
from tests.unit.data.test_importers import import_fails, read_back

TRAIN_ROWS = [
    ("1.5", "CA", "red", "yes"),
    ("2", "NY", "blue", "no"),
    ("-3", " CA", "green", "no"),  # spaces around a category are not part of it
    ("4", "TX", "red", "yes"),
    ("5", "NY", "red", "no"),
]
TEST_ROWS = [("7", "TX", "green", "yes"), ("8", "CA", "red", "no")]


def csv_text(rows, columns=("age", "state", "color", "bought")) -> str:
    return ",".join(columns) + "\n" + "".join(",".join(row) + "\n" for row in rows)


def one_hot(rows, states=("CA", "NY", "TX"), colors=("blue", "green", "red")) -> np.ndarray:
    """The expected features: age, then state=..., then color=..., as the importer should write them."""
    return np.array([
        [float(age), *(float(state.strip() == s) for s in states), *(float(color == c) for c in colors)]
        for age, state, color, _ in rows
    ], dtype=np.float32)


def test_one_hot_round_trip_and_meta(tmp_path, monkeypatch):
    source = tmp_path / "train.csv"
    source.write_text(csv_text(TRAIN_ROWS))
    monkeypatch.setattr(csv_format, "CSV_BLOCK_BYTES", 64)  # the category pass sees a few rows at a time
    dataset = import_dataset(str(source), str(tmp_path / "train"), "csv", categorical=["state", "2"])
    names = ["age", "state=CA", "state=NY", "state=TX", "color=blue", "color=green", "color=red"]
    assert dataset.feature_names == names and dataset.shape == (7,)
    meta = json.loads((tmp_path / "train" / "meta.json").read_text())
    assert meta["encoding"] == {"label": "bought", "columns": ["age", "state", "color"],
                                "categories": {"state": ["CA", "NY", "TX"], "color": ["blue", "green", "red"]}}
    features, labels, _ = read_back(tmp_path / "train")
    np.testing.assert_array_equal(features, one_hot(TRAIN_ROWS))
    assert labels.tolist() == [row[3] for row in TRAIN_ROWS]


def test_encoding_from_gives_a_second_file_the_same_features(tmp_path):
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    train.write_text(csv_text(TRAIN_ROWS))
    # The test file lacks 'NY' and 'blue' and orders its columns differently: the features do not change.
    test.write_text(csv_text([(row[2], row[3], row[0], row[1]) for row in TEST_ROWS],
                             columns=("color", "bought", "age", "state")))
    import_dataset(str(train), str(tmp_path / "train"), "csv", categorical=["state", "color"])
    dataset = import_dataset(str(test), str(tmp_path / "test"), "csv", encoding_from=str(tmp_path / "train"))
    assert dataset.feature_names == open_names(tmp_path / "train")
    assert dataset.meta["source"]["label"] == "bought"  # the reference's label column, found by name
    features, labels, _ = read_back(tmp_path / "test")
    np.testing.assert_array_equal(features, one_hot(TEST_ROWS))
    assert labels.tolist() == ["yes", "no"]


def open_names(path) -> list[str]:
    return json.loads((path / "meta.json").read_text())["feature_names"]


def test_parquet_reuses_a_csv_encoding(tmp_path):
    train = tmp_path / "train.csv"
    train.write_text(csv_text(TRAIN_ROWS))
    import_dataset(str(train), str(tmp_path / "train"), "csv", categorical=["state", "color"])
    columns = list(zip(*TEST_ROWS))
    table = pa.table({"age": np.array(columns[0], dtype=float), "state": columns[1], "color": columns[2],
                      "bought": columns[3]})
    pq.write_table(table, tmp_path / "test.parquet")
    import_dataset(str(tmp_path / "test.parquet"), str(tmp_path / "test"), "parquet",
                   encoding_from=str(tmp_path / "train"))
    features, labels, _ = read_back(tmp_path / "test")
    np.testing.assert_array_equal(features, one_hot(TEST_ROWS))
    assert labels.tolist() == ["yes", "no"]


def test_unseen_category_names_file_and_line(tmp_path):
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    train.write_text(csv_text(TRAIN_ROWS))
    test.write_text(csv_text([*TEST_ROWS, ("9", "WA", "red", "no")]))
    import_dataset(str(train), str(tmp_path / "train"), "csv", categorical=["state", "color"])
    import_fails(test, tmp_path / "test", "csv",
                 f"^{test}:4: column 'state' holds 'WA', a category the encoding of {tmp_path / 'train'} "
                 r"does not have \(it has: CA, NY, TX\)$", encoding_from=str(tmp_path / "train"))


def test_encoding_from_needs_the_same_columns_and_an_encoding(tmp_path):
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    train.write_text(csv_text(TRAIN_ROWS))
    import_dataset(str(train), str(tmp_path / "train"), "csv", categorical=["state", "color"])
    test.write_text(csv_text([row[:2] + row[3:] for row in TEST_ROWS], columns=("age", "state", "bought")))
    import_fails(test, tmp_path / "test", "csv",
                 f"^{test}: lacks the feature column\\(s\\) color of the encoding of {tmp_path / 'train'}$",
                 encoding_from=str(tmp_path / "train"))
    libsvm = tmp_path / "small.svm"
    libsvm.write_text("1 1:1\n")
    import_dataset(str(libsvm), str(tmp_path / "sparse"), "libsvm")
    import_fails(test, tmp_path / "test", "csv", f"^{tmp_path / 'sparse'}/meta.json: has no 'encoding'",
                 encoding_from=str(tmp_path / "sparse"))
    import_fails(test, tmp_path / "test", "csv", "give categorical columns or encoding_from, not both",
                 encoding_from=str(tmp_path / "train"), categorical=["state"])


def test_undeclared_text_empty_category_and_bad_declarations(tmp_path):
    source = tmp_path / "train.csv"
    source.write_text(csv_text(TRAIN_ROWS))
    import_fails(source, tmp_path / "out", "csv",
                 f"^{source}:2: column 'state' holds 'CA', which is not a number "
                 r"\(if 'state' is categorical, declare it: --categorical state\)$")
    import_fails(source, tmp_path / "out", "csv", f"^{source}: categorical column 'zip' not found",
                 categorical=["state", "zip"])
    import_fails(source, tmp_path / "out", "csv", f"^{source}: column 'bought' is the label",
                 categorical=["bought"])
    import_fails(source, tmp_path / "out", "csv", f"^{source}: encodes to 7 features .*, but n_features=3$",
                 categorical=["state", "color"], n_features=3)
    gap = tmp_path / "gap.csv"
    gap.write_text(csv_text([*TRAIN_ROWS[:2], ("3", "", "red", "no")]))
    import_fails(gap, tmp_path / "out", "csv", f"^{gap}:4: the categorical column 'state' is empty$",
                 categorical=["state", "color"])
    import_fails(tmp_path / "gap.csv", tmp_path / "out", "libsvm", "apply to csv and parquet, not libsvm",
                 categorical=["state"])


def test_a_wide_encoding_is_written_a_bounded_slice_at_a_time(tmp_path, monkeypatch):
    rows = [(str(row), f"id{row:03d}", "x", str(row % 2)) for row in range(300)]
    source = tmp_path / "ids.csv"
    source.write_text(csv_text(rows))
    monkeypatch.setattr(common, "CHUNK_BYTES", 50 * 302 * 4)  # 50 rows of 302 float32 features
    sizes: list[int] = []
    original = common.ImportWriter.write
    monkeypatch.setattr(common.ImportWriter, "write",
                        lambda self, features, labels: sizes.append(len(features)) or original(self, features, labels))
    dataset = import_dataset(str(source), str(tmp_path / "out"), "csv", categorical=["state", "color"])
    assert dataset.shape == (302,) and sizes == [50] * 6
    features, _, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features[:, 1:301], np.eye(300))


def test_rows_to_predict_are_encoded_as_the_training_set_with_or_without_its_label(tmp_path):
    train = tmp_path / "train.csv"
    train.write_text(csv_text(TRAIN_ROWS))
    import_dataset(str(train), str(tmp_path / "train"), "csv", categorical=["state", "color"])
    without = tmp_path / "new.csv"  # no label column, columns in another order
    without.write_text(csv_text([(row[2], row[0], row[1]) for row in TEST_ROWS], columns=("color", "age", "state")))
    still = tmp_path / "labeled.csv"  # the label column still there: not read
    still.write_text(csv_text(TEST_ROWS))
    columns = list(zip(*TEST_ROWS))
    pq.write_table(pa.table({"state": columns[1], "age": np.array(columns[0], dtype=float), "color": columns[2]}),
                   tmp_path / "new.parquet")
    for source, format in ((without, "csv"), (still, "csv"), (tmp_path / "new.parquet", "parquet")):
        out = tmp_path / f"new-{source.name}"
        dataset = import_dataset(str(source), str(out), format, unlabeled=True, encoding_from=str(tmp_path / "train"))
        assert not dataset.labeled and dataset.feature_names == open_names(tmp_path / "train")
        np.testing.assert_array_equal(dataset.read_all()[0], one_hot(TEST_ROWS))


def test_an_unlabeled_table_without_a_reference_has_every_column_a_feature(tmp_path):
    source = tmp_path / "new.csv"
    source.write_text(csv_text([row[:3] for row in TRAIN_ROWS], columns=("age", "state", "color")))
    dataset = import_dataset(str(source), str(tmp_path / "new"), "csv", unlabeled=True, categorical=["state", "color"])
    assert not dataset.labeled
    features, _ = dataset.read_all()
    np.testing.assert_array_equal(features, one_hot(TRAIN_ROWS))
    meta = json.loads((tmp_path / "new" / "meta.json").read_text())
    assert meta["encoding"]["label"] is None and meta["source"]["label"] is None
    plain = tmp_path / "numbers.csv"  # nothing categorical: the first pass still counts the rows
    plain.write_text("a,b\n1,2\n3,4\n5,6\n")
    numbers = import_dataset(str(plain), str(tmp_path / "numbers"), "csv", unlabeled=True)
    assert numbers.rows == 3 and numbers.shape == (2,) and not numbers.labeled
    # an encoding read back from an unlabeled import serves a later one
    again = import_dataset(str(source), str(tmp_path / "again"), "csv", unlabeled=True,
                           encoding_from=str(tmp_path / "new"))
    assert again.feature_names == open_names(tmp_path / "new")


def test_unlabeled_imports_refuse_labels_and_name_a_bad_value(tmp_path):
    train = tmp_path / "train.csv"
    train.write_text(csv_text(TRAIN_ROWS))
    import_dataset(str(train), str(tmp_path / "train"), "csv", categorical=["state", "color"])
    bad = tmp_path / "bad.csv"
    bad.write_text(csv_text([("red", "no", "7", "TX"), ("red", "no", "x", "CA")],
                            columns=("color", "bought", "age", "state")))
    import_fails(bad, tmp_path / "out", "csv", f"^{bad}:3: column 'age' holds 'x', which is not a number",
                 unlabeled=True, encoding_from=str(tmp_path / "train"))
    import_fails(train, tmp_path / "out", "csv", f"^{train}: unlabeled: features alone, from npy, csv, parquet "
                 r"\(no label or classes\)", unlabeled=True, label="bought")
    libsvm = tmp_path / "small.svm"
    libsvm.write_text("1 1:1\n")
    import_fails(libsvm, tmp_path / "out", "libsvm", "libsvm files are imported with their labels$", unlabeled=True)
