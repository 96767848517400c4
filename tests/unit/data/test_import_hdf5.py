"""HDF5 import: exact round trips read in row chunks, dataset names by default or by option, clean failures."""

from __future__ import annotations

import h5py
import numpy as np

from shoal.data.importers import common, import_dataset
from tests.unit.data.test_importers import import_fails, read_back, record_writes


def test_default_names_round_trip_in_row_chunks(tmp_path, monkeypatch):
    generator = np.random.default_rng(5)
    x = generator.standard_normal((203, 4, 3)).astype(np.float32)
    y = generator.integers(0, 3, size=203)
    with h5py.File(tmp_path / "data.h5", "w") as handle:
        handle.create_dataset("x", data=x, chunks=(16, 4, 3), compression="gzip")
        handle.create_dataset("y", data=y)
        handle.create_dataset("notes", data=np.zeros(3))
    monkeypatch.setattr(common, "CHUNK_BYTES", 50 * 12 * 4)
    sizes = record_writes(monkeypatch)
    dataset = import_dataset(str(tmp_path / "data.h5"), str(tmp_path / "out"), "hdf5")
    assert sizes == [50, 50, 50, 50, 3]
    assert dataset.shape == (4, 3) and dataset.feature_dtype == np.float32 and dataset.classes == [0, 1, 2]
    assert dataset.meta["source"] | {"path": None} == {"format": "hdf5", "path": None, "features": "/x", "labels": "/y"}
    features, labels, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, x)
    np.testing.assert_array_equal(labels, y)


def test_named_datasets_in_groups_with_text_labels_and_uint8_images(tmp_path):
    images = np.random.default_rng(6).integers(0, 256, size=(9, 8, 8), dtype=np.uint8)
    names = np.array(["cat", "dog", "emu"])[np.arange(9) % 3]
    with h5py.File(tmp_path / "data.h5", "w") as handle:
        handle.create_dataset("train/images", data=images)
        handle.create_dataset("train/names", data=names.astype(object), dtype=h5py.string_dtype())
    dataset = import_dataset(str(tmp_path / "data.h5"), str(tmp_path / "out"), "hdf5", features="train/images",
                             label="train/names")
    assert dataset.feature_dtype == np.uint8 and dataset.classes == ["cat", "dog", "emu"]
    features, labels, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, images)
    assert labels.tolist() == names.tolist()


def test_int64_features_and_column_labels(tmp_path):
    x = np.arange(24, dtype=np.int64).reshape(6, 4)
    with h5py.File(tmp_path / "data.h5", "w") as handle:
        handle["features"] = x
        handle["label"] = np.array([[-1], [1], [-1], [1], [1], [1]], dtype=np.int8)
    dataset = import_dataset(str(tmp_path / "data.h5"), str(tmp_path / "out"), "hdf5")
    assert dataset.classes == [-1, 1]
    features, labels, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, x.astype(np.float32))
    np.testing.assert_array_equal(labels, [-1, 1, -1, 1, 1, 1])


def test_missing_datasets_are_listed(tmp_path):
    source = tmp_path / "data.h5"
    with h5py.File(source, "w") as handle:
        handle["pixels"] = np.zeros((3, 2))
        handle["y"] = np.zeros(3)
    import_fails(source, tmp_path / "out", "hdf5",
                 f"^{source}: no features dataset named x or features or X or data; name it with --features "
                 r"\(the file holds: pixels, y\)$")
    import_fails(source, tmp_path / "out", "hdf5", f"^{source}: no dataset 'labels' \\(the file holds: pixels, y\\)$",
                 features="pixels", label="labels")


def test_count_mismatch_empty_and_not_hdf5(tmp_path):
    source = tmp_path / "data.h5"
    with h5py.File(source, "w") as handle:
        handle["x"] = np.zeros((3, 2))
        handle["y"] = np.zeros(4)
        handle["none"] = np.zeros((0, 2))
        handle["no_labels"] = np.zeros(0)
    import_fails(source, tmp_path / "out", "hdf5", f"^{source}: /x holds 3 samples but /y holds 4 labels$")
    import_fails(source, tmp_path / "out", "hdf5", f"^{source}:/none: holds no samples: the source is empty$",
                 features="none", label="no_labels")
    text = tmp_path / "text.h5"
    text.write_text("not hdf5")
    import_fails(text, tmp_path / "out", "hdf5", f"^{text}: not a readable HDF5 file")


def test_features_option_is_for_hdf5_only(tmp_path):
    source = tmp_path / "small.csv"
    source.write_text("a,y\n1,0\n")
    import_fails(source, tmp_path / "out", "csv", f"^{source}: features names an HDF5 dataset", features="x")
