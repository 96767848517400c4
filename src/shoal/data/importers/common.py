"""What every importer shares: the request it is handed, chunk sizes, the writer, checks and row locators.

Every importer streams: it reads its source in chunks and hands each chunk to `DatasetWriter`,
so memory stays flat however large the input is, and a failure part-way leaves no output
folder behind (the writer removes its temporary folder). Errors about the input are
`DataError`s that name the file and, where there is one, the line or row at fault. The format
modules import from here, never from the package, so importing one of them cannot cycle back.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from shoal.data.declared_classes import DeclaredClasses
from shoal.data.encoding import Encoding, Locate, resolve_columns, shown
from shoal.data.format import ROW_GROUP_BYTES, DatasetWriter, first_non_finite
from shoal.errors import DataError

# Bytes of dense features per chunk handed to the writer, and per row group the writer buffers:
# together they bound an import's memory however large the source is.
CHUNK_BYTES = 32 * 1024 * 1024
ROW_GROUP_ROWS = 65_536


@dataclass(frozen=True)
class ImportRequest:
    """What `import_dataset` hands a format's `import_file`, once it has checked its arguments."""

    source: str
    out: str
    format: str
    n_features: int | None
    label: str | None
    features: str | None  # hdf5: the features dataset
    categorical: list[str]  # tables: the columns to one-hot encode
    encoding: Encoding | None  # tables: the reference encoding (encoding_from)
    writer_options: dict[str, Any]
    unlabeled: bool = False  # rows to predict: features only


def check_file(path: str) -> None:
    if not os.path.exists(path):
        raise DataError(f"{path}: file not found")
    if not os.path.isfile(path):
        raise DataError(f"{path}: not a file")


class ImportWriter(DatasetWriter):
    """A `DatasetWriter` that first checks each chunk's labels against the declared classes."""

    def __init__(self, *args: Any, declared: DeclaredClasses | None, locate: Locate, **options: Any):
        super().__init__(*args, **options)
        self.declared = declared
        self.locate = locate  # row number (0-based, source-wide) -> "file:line" or "file: row N"
        self.handed = 0

    def write(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        if self.declared is not None and labels is not None:
            self.declared.check(labels, self.handed, self.locate)
        self._check_finite(features, labels)
        self.handed += len(features)
        super().write(features, labels)

    def _check_finite(self, features: np.ndarray, labels: np.ndarray | None) -> None:
        """A NaN or infinity is refused here, naming the source row, not when training reads it (where it would
        be refused all the same)."""
        features = np.asarray(features)
        numeric = labels is not None and not self.classification and np.asarray(labels).dtype.kind == "f"
        for values, what in ((features if features.dtype.kind == "f" else None, "feature"),
                             (np.asarray(labels) if numeric else None, "label")):
            bad = first_non_finite(values)
            if bad is not None:
                raise DataError(f"{self.locate(self.handed + bad[0])}: a non-finite {what} ({bad[1]}): shoal trains on "
                                "none; fix or drop the row at the source")


def import_writer(
    out: str, shape: tuple[int, ...], dtype: np.dtype, options: dict[str, Any], *, locate: Locate, **more: Any
) -> ImportWriter:
    """An `ImportWriter` whose row groups stay within `ROW_GROUP_BYTES`, however wide the rows."""
    row_bytes = math.prod(shape) * np.dtype(dtype).itemsize
    group_rows = max(1, min(ROW_GROUP_ROWS, ROW_GROUP_BYTES // row_bytes))
    return ImportWriter(out, shape, dtype, row_group_size=group_rows, locate=locate, **options, **more)


def rows_per_chunk(sample_shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Rows per chunk handed to the writer: `CHUNK_BYTES` of features, counted as at least float32."""
    return max(1, CHUNK_BYTES // (math.prod(sample_shape) * max(dtype.itemsize, 4)))


def row_locator(source: str) -> Locate:
    """Names row `row` (0-based) of a binary source as `file: row N` (1-based)."""
    return lambda row: f"{source}: row {row + 1}"


def offset_locator(locate: Locate, first_row: int) -> Locate:
    """`locate` for rows counted from `first_row`, as rows of a batch are."""
    return lambda row: locate(first_row + row)


def source_meta(format: str, source: str, **more: Any) -> dict[str, Any]:
    return {"source": {"format": format, "path": os.path.abspath(source), **more}}


# Arrays: NumPy, IDX and HDF5 sources ---------------------------------------------------------


def sample_shape_of(source: str, shape: tuple[int, ...], dtype: np.dtype, n_features: int | None) -> tuple[int, ...]:
    """The shape of one sample; a 1-D array holds one feature per sample."""
    if len(shape) == 0:
        raise DataError(f"{source}: holds a single number, not an array of samples")
    if dtype.kind not in "biuf":
        raise DataError(f"{source}: features have dtype {dtype}; expected numbers")
    sample_shape = tuple(shape[1:]) or (1,)
    if 0 in sample_shape:
        raise DataError(f"{source}: samples have shape {sample_shape}, which holds no features")
    if n_features is not None and n_features != math.prod(sample_shape):
        raise DataError(
            f"{source}: samples have {math.prod(sample_shape)} features (shape {sample_shape}), "
            f"but n_features={n_features}"
        )
    return sample_shape


def stored_dtype(dtype: np.dtype) -> np.dtype:
    """uint8 (images) and float32 are kept; every other number type becomes float32."""
    return dtype if dtype in (np.dtype(np.uint8), np.dtype(np.float32)) else np.dtype(np.float32)


def labels_dtype_of(path: str, shape: tuple[int, ...], dtype: np.dtype) -> np.dtype:
    if len(shape) != 1 and not (len(shape) == 2 and shape[1] == 1):
        raise DataError(f"{path}: labels have shape {shape}; expected (n,) or (n, 1)")
    if dtype.kind in "biu":
        return np.dtype(np.int64)
    if dtype.kind == "f":
        return np.dtype(np.float64)
    if dtype.kind in "US":
        return np.dtype(str)
    raise DataError(f"{path}: labels have dtype {dtype}; expected numbers or text")


# Tables: CSV and Parquet sources -------------------------------------------------------------


@dataclass(frozen=True)
class TableColumns:
    """A table's columns as an import uses them: the label, the features, the features to one-hot encode."""

    label_position: int | None  # None: an unlabeled import (rows to predict)
    label: str | None
    features: list[str]
    categorical: list[str]

    @property
    def read_label(self) -> list[str]:
        """The label column to read with the features: none for an unlabeled import."""
        return [] if self.label is None else [self.label]


def table_columns(request: ImportRequest, names: list[str]) -> TableColumns:
    """Resolve the label and categorical columns; a reference encoding names both. Unlabeled, every column is a
    feature, except the reference's label column where the table still has it."""
    label, encoding = request.label, request.encoding
    if label is None and encoding is not None and encoding.label in names:
        label = encoding.label
    label_position = None if request.unlabeled and label is None else label_column(request.source, names, label)
    label_name = None if label_position is None else names[label_position]
    features = [name for position, name in enumerate(names) if position != label_position]
    if not features:
        raise DataError(f"{request.source}: no feature columns besides the label column {label_name!r}")
    if encoding is not None:
        encoding.check_columns(request.source, features)
        categorical = list(encoding.categories)
    else:
        categorical = resolve_columns(request.source, names, request.categorical, label_position)
    if request.unlabeled:  # the reference's label, read no further
        return TableColumns(None, None, features, categorical)
    return TableColumns(label_position, label_name, features, categorical)


def label_column(source: str, header: list[str], label: str | None) -> int:
    """The position of the label column: a name, a 0-based number (negative from the end), or the last."""
    if label is None:
        return len(header) - 1
    if label in header:
        return header.index(label)
    try:
        position = int(label)
    except ValueError:
        position = None
    if position is not None and -len(header) <= position < len(header):
        return position % len(header)
    raise DataError(f"{source}: label column {label!r} not found; the columns are: {shown(header)}")
