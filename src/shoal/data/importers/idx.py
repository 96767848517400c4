"""Import of IDX files (MNIST's format), gzipped or not, with their labels file.

An IDX file is a 4-byte magic number (two zero bytes, a type code, the number of dimensions),
one big-endian 32-bit size per dimension, then the values, big-endian, in C order. The first
dimension counts samples and the rest is one sample's shape: MNIST's
`train-images-idx3-ubyte.gz` holds uint8 28x28 images and `train-labels-idx1-ubyte.gz` their
labels. Both files are read in chunks of rows, side by side, so memory stays flat.
"""

from __future__ import annotations

import gzip
import math
import zlib
from contextlib import ExitStack
from typing import IO

import numpy as np

from shoal.data.importers.common import (
    ImportRequest,
    check_file,
    import_writer,
    labels_dtype_of,
    row_locator,
    rows_per_chunk,
    sample_shape_of,
    source_meta,
    stored_dtype,
)
from shoal.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"
TYPE_CODES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
KNOWN_CODES = "0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64"


def import_file(request: ImportRequest) -> None:
    source, label = request.source, request.label
    if label is None:
        raise DataError(f"{source}: an IDX import needs its labels: pass the labels IDX file "
                        "(e.g. train-labels-idx1-ubyte.gz) as label")
    check_file(label)
    with ExitStack() as stack:
        samples = stack.enter_context(_open(source))
        labels = stack.enter_context(_open(label))
        shape, dtype = read_header(source, samples)
        label_shape, label_dtype = read_header(label, labels)
        _check_counts(source, label, shape, label_shape)
        sample_shape = sample_shape_of(source, shape, dtype, request.n_features)
        labels_target = labels_dtype_of(label, label_shape, label_dtype)
        rows = rows_per_chunk(sample_shape, dtype)
        meta = source_meta("idx", source, labels=label)
        stored = stored_dtype(dtype.newbyteorder("="))
        locate = row_locator(label)  # the labels file holds a bad label
        with import_writer(request.out, sample_shape, stored, request.writer_options, locate=locate,
                           extra_meta=meta) as writer:
            for start in range(0, shape[0], rows):
                count = min(rows, shape[0] - start)
                features = _read(source, samples, dtype, (count, *sample_shape), start, shape[0])
                targets = _read(label, labels, label_dtype, (count,), start, shape[0])
                writer.write(features.astype(stored), targets.astype(labels_target))
            for path, handle in ((source, samples), (label, labels)):
                if _read_bytes(path, handle, 1):
                    raise DataError(f"{path}: has bytes after the {shape[0]:,} samples its header declares")


def _check_counts(source: str, label: str, shape: tuple[int, ...], label_shape: tuple[int, ...]) -> None:
    """One label per sample, and at least one sample."""
    if len(label_shape) != 1 and not (len(label_shape) == 2 and label_shape[1] == 1):
        raise DataError(f"{label}: labels have shape {label_shape}; expected one dimension (n,)")
    if label_shape[0] != shape[0]:
        raise DataError(f"{label}: holds {label_shape[0]:,} labels, but {source} holds {shape[0]:,} samples")
    if shape[0] == 0:
        raise DataError(f"{source}: holds no samples: the source is empty")


def _open(path: str) -> IO[bytes]:
    """The file's bytes, through gzip when it starts with gzip's magic number (whatever its name)."""
    try:
        with open(path, "rb") as handle:
            compressed = handle.read(2) == GZIP_MAGIC
        return gzip.open(path, "rb") if compressed else open(path, "rb")
    except OSError as error:
        raise DataError(f"{path}: cannot read: {error.strerror or error}") from None


def read_header(path: str, handle: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    """The dimensions and (big-endian) value type an IDX header declares; a bad header raises `DataError`."""
    magic = _read_bytes(path, handle, 4)
    if len(magic) < 4:
        raise DataError(f"{path}: not an IDX file: too short for the 4-byte magic number")
    if magic[:2] != b"\0\0" or magic[3] == 0:
        raise DataError(f"{path}: not an IDX file: bad magic number 0x{magic.hex()} "
                        "(expected two zero bytes, a type code and a dimension count)")
    if magic[2] not in TYPE_CODES:
        raise DataError(f"{path}: unknown IDX type code 0x{magic[2]:02x} (known: {KNOWN_CODES})")
    sizes = _read_bytes(path, handle, 4 * magic[3])
    if len(sizes) < 4 * magic[3]:
        raise DataError(f"{path}: truncated: the header declares {magic[3]} dimensions but ends early")
    shape = tuple(int(size) for size in np.frombuffer(sizes, dtype=">u4"))
    return shape, TYPE_CODES[magic[2]]


def _read(path: str, handle: IO[bytes], dtype: np.dtype, shape: tuple[int, ...], start: int, total: int) -> np.ndarray:
    """Rows `start..start+shape[0]` of `total`, as native-order values."""
    size = math.prod(shape) * dtype.itemsize
    data = _read_bytes(path, handle, size)
    if len(data) < size:
        complete = start + len(data) // (size // shape[0])
        raise DataError(f"{path}: truncated: the header declares {total:,} samples, but the data holds {complete:,}")
    return np.frombuffer(data, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def _read_bytes(path: str, handle: IO[bytes], size: int) -> bytes:
    """Up to `size` bytes (fewer only at the end of the data); gzip trouble raises `DataError`."""
    data = bytearray()
    try:
        while len(data) < size:
            block = handle.read(size - len(data))
            if not block:
                break
            data += block
    except EOFError:
        raise DataError(f"{path}: truncated: the gzip stream ends early") from None
    except (gzip.BadGzipFile, zlib.error, OSError) as error:
        raise DataError(f"{path}: cannot read the gzip stream: {error}") from None
    return bytes(data)
