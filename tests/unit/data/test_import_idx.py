"""IDX (MNIST) import: exact round trips, gzipped or not, for every IDX type; clean failures naming the file."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from shoal.data.importers import common, import_dataset
from shoal.data.importers.idx import TYPE_CODES
from tests.unit.data.test_importers import import_fails, read_back, record_writes

CODES = {dtype.newbyteorder("=").name: code for code, dtype in TYPE_CODES.items()}


def idx_bytes(array: np.ndarray) -> bytes:
    """The IDX encoding of `array`, written here from the format's definition."""
    code = CODES[array.dtype.name]
    header = bytes([0, 0, code, array.ndim]) + np.array(array.shape, dtype=">u4").tobytes()
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path, array: np.ndarray, compressed: bool = False):
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data) if compressed else data)
    return path


def mnist_like(tmp_path, rows: int = 70, compressed: bool = True):
    generator = np.random.default_rng(3)
    images = generator.integers(0, 256, size=(rows, 28, 28), dtype=np.uint8)
    labels = generator.integers(0, 10, size=rows).astype(np.uint8)
    suffix = ".gz" if compressed else ""
    images_path = write_idx(tmp_path / f"train-images-idx3-ubyte{suffix}", images, compressed)
    labels_path = write_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", labels, compressed)
    return images, labels, images_path, labels_path


@pytest.mark.parametrize("compressed", [True, False])
def test_mnist_images_round_trip_as_uint8_in_chunks(tmp_path, monkeypatch, compressed):
    images, labels, images_path, labels_path = mnist_like(tmp_path, compressed=compressed)
    monkeypatch.setattr(common, "CHUNK_BYTES", 32 * 28 * 28 * 4)  # 32 images a chunk
    sizes = record_writes(monkeypatch)
    dataset = import_dataset(str(images_path), str(tmp_path / "out"), "idx", label=str(labels_path))
    assert sizes == [32, 32, 6]
    assert dataset.shape == (28, 28) and dataset.feature_dtype == np.uint8
    assert dataset.meta["source"]["format"] == "idx"
    features, read_labels, classes = read_back(tmp_path / "out")
    assert classes == sorted(set(labels.tolist()))
    np.testing.assert_array_equal(features, images)
    np.testing.assert_array_equal(read_labels, labels)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.float32, np.float64])
def test_every_idx_type_round_trips_as_float32(tmp_path, dtype):
    # Values every type holds exactly, and float32 too: big-endian decoding must get them back.
    values = (np.arange(5 * 3 * 2).reshape(5, 3, 2) * 7 - 100).astype(dtype)
    if np.dtype(dtype).kind == "f":
        values = values / 4
    write_idx(tmp_path / "x.idx", values)
    write_idx(tmp_path / "y.idx", np.array([1, 2, 1, 2, 1], dtype=np.int16))
    dataset = import_dataset(str(tmp_path / "x.idx"), str(tmp_path / "out"), "idx", label=str(tmp_path / "y.idx"))
    assert dataset.shape == (3, 2) and dataset.feature_dtype == np.float32
    features, labels, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, values.astype(np.float32))
    np.testing.assert_array_equal(labels, [1, 2, 1, 2, 1])


def test_one_dimensional_idx_is_one_feature(tmp_path):
    write_idx(tmp_path / "x.idx", np.array([5, 6, 7], dtype=np.uint8))
    write_idx(tmp_path / "y.idx", np.array([0, 1, 0], dtype=np.uint8))
    dataset = import_dataset(str(tmp_path / "x.idx"), str(tmp_path / "out"), "idx", label=str(tmp_path / "y.idx"))
    assert dataset.shape == (1,)
    features, _, _ = read_back(tmp_path / "out")
    np.testing.assert_array_equal(features, [[5], [6], [7]])


@pytest.mark.parametrize("compressed", [True, False])
def test_truncated_images_file(tmp_path, compressed):
    images, labels, _, labels_path = mnist_like(tmp_path, rows=10, compressed=False)
    data = idx_bytes(images)[: -28 * 28 - 5]  # the last image and a bit of the one before are lost
    source = tmp_path / "images.idx"
    source.write_bytes(gzip.compress(data)[:-12] if compressed else data)
    expected = "the gzip stream ends early" if compressed else "the header declares 10 samples, but the data holds 8"
    import_fails(source, tmp_path / "out", "idx", f"^{source}: truncated: {expected}$", label=str(labels_path))


def test_bad_magic_and_unknown_type(tmp_path):
    _, _, images_path, labels_path = mnist_like(tmp_path, rows=4, compressed=False)
    source = tmp_path / "text.idx"
    source.write_text("hello, world")
    import_fails(source, tmp_path / "out", "idx", f"^{source}: not an IDX file: bad magic number 0x68656c6c",
                 label=str(labels_path))
    source.write_bytes(bytes([0, 0, 0x0A, 1, 0, 0, 0, 1, 5]))
    import_fails(source, tmp_path / "out", "idx", f"^{source}: unknown IDX type code 0x0a", label=str(labels_path))
    source.write_bytes(b"\0\0")
    import_fails(source, tmp_path / "out", "idx", f"^{source}: not an IDX file: too short", label=str(labels_path))


def test_label_count_mismatch_names_the_labels_file(tmp_path):
    images, labels, images_path, _ = mnist_like(tmp_path, rows=12)
    short = write_idx(tmp_path / "short-labels.gz", labels[:11], compressed=True)
    import_fails(images_path, tmp_path / "out", "idx", f"^{short}: holds 11 labels, but {images_path} holds 12 samples",
                 label=str(short))


def test_trailing_bytes_and_missing_labels(tmp_path):
    images, labels, _, labels_path = mnist_like(tmp_path, rows=3, compressed=False)
    source = tmp_path / "long.idx"
    source.write_bytes(idx_bytes(images) + b"\0")
    import_fails(source, tmp_path / "out", "idx", f"^{source}: has bytes after the 3 samples", label=str(labels_path))
    import_fails(source, tmp_path / "out", "idx", "needs its labels")
