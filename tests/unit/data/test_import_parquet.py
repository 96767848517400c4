"""Parquet table import: exact round trips read batch by batch, text columns one-hot when declared, clean failures."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shoal.data.importers import common, import_dataset, parquet
from tests.unit.data.test_importers import import_fails, read_back, record_writes


def test_number_columns_round_trip_over_row_groups(tmp_path, monkeypatch):
    rows = 230
    generator = np.random.default_rng(7)
    table = pa.table({
        "height": generator.standard_normal(rows).astype(np.float32),
        "count": generator.integers(-50, 50, size=rows),
        "flag": generator.integers(0, 2, size=rows).astype(bool),
        "weight": generator.standard_normal(rows).astype(np.float64).round(3),
        "kind": generator.integers(0, 4, size=rows).astype(np.int32),
    })
    pq.write_table(table, tmp_path / "table.parquet", row_group_size=64)
    monkeypatch.setattr(common, "CHUNK_BYTES", 40 * 4 * 4)  # 40 rows of four float32 features
    sizes = record_writes(monkeypatch)
    dataset = import_dataset(str(tmp_path / "table.parquet"), str(tmp_path / "out"), "parquet")
    assert max(sizes) <= 40 and sum(sizes) == rows
    assert dataset.feature_names == ["height", "count", "flag", "weight"] and dataset.classes == [0, 1, 2, 3]
    features, labels, _ = read_back(tmp_path / "out")
    expected = np.stack([table.column(name).to_numpy().astype(np.float32) for name in dataset.feature_names], axis=1)
    np.testing.assert_array_equal(features, expected)
    np.testing.assert_array_equal(labels, table.column("kind").to_numpy())


def test_label_by_name_text_labels_and_a_declared_categorical_column(tmp_path, monkeypatch):
    table = pa.table({
        "species": ["emu", "cat", "emu", "dog"],
        "state": pa.array(["NY", "CA", "NY", "TX"]).dictionary_encode(),
        "age": pa.array([1, 2, 3, 4], type=pa.int16()),
    })
    pq.write_table(table, tmp_path / "animals.parquet", row_group_size=3)
    monkeypatch.setattr(parquet, "BATCH_ROWS", 2)  # the category pass sees one batch at a time
    dataset = import_dataset(str(tmp_path / "animals.parquet"), str(tmp_path / "out"), "parquet", label="species",
                             categorical=["state"])
    assert dataset.feature_names == ["state=CA", "state=NY", "state=TX", "age"]
    assert dataset.meta["encoding"] == {"label": "species", "columns": ["state", "age"],
                                        "categories": {"state": ["CA", "NY", "TX"]}}
    features, labels, classes = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, [[0, 1, 0, 1], [1, 0, 0, 2], [0, 1, 0, 3], [0, 0, 1, 4]])
    assert classes == ["cat", "dog", "emu"] and labels.tolist() == ["emu", "cat", "emu", "dog"]


def test_undeclared_text_column_null_and_empty_sources(tmp_path):
    source = tmp_path / "table.parquet"
    pq.write_table(pa.table({"state": ["CA", "NY"], "y": [0, 1]}), source)
    import_fails(source, tmp_path / "out", "parquet",
                 f"^{source}: column 'state' holds text \\(string\\), not numbers "
                 "\\(if 'state' is categorical, declare it: --categorical state\\)$")
    pq.write_table(pa.table({"a": [1.0, None, 3.0], "y": [0, 1, 0]}), source)
    import_fails(source, tmp_path / "out", "parquet", f"^{source}: row 2: column 'a' is empty \\(null\\)$")
    pq.write_table(pa.table({"a": [1.0, 2.0], "y": pa.array([0, None], type=pa.int64())}), source)
    import_fails(source, tmp_path / "out", "parquet", f"^{source}: row 2: column 'y' is empty \\(null\\)$")
    pq.write_table(pa.table({"a": pa.array([], type=pa.float32()), "y": pa.array([], type=pa.int64())}), source)
    import_fails(source, tmp_path / "out", "parquet", f"^{source}: holds no rows: the source is empty$")
    pq.write_table(pa.table({"a": [[1.0], [2.0]], "y": [0, 1]}), source)
    import_fails(source, tmp_path / "out", "parquet", "column 'a' has type list<element: double>, which is neither")
    text = tmp_path / "text.parquet"
    text.write_text("a,y\n1,0\n")
    import_fails(text, tmp_path / "out", "parquet", f"^{text}: not a readable Parquet file")


def test_feature_count_and_missing_label(tmp_path):
    source = tmp_path / "table.parquet"
    pq.write_table(pa.table({"a": [1.0], "b": [2.0], "y": [0]}), source)
    import_fails(source, tmp_path / "out", "parquet", f"^{source}: encodes to 2 features, but n_features=3$",
                 n_features=3)
    import_fails(source, tmp_path / "out", "parquet",
                 f"^{source}: label column 'z' not found; the columns are: a, b, y$", label="z")
