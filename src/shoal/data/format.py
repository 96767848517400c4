"""The dataset folder format: Parquet files plus `meta.json`.

A dataset is a folder (local path or any URI pyarrow's filesystems open) holding
`part-NNNNN.parquet` files with two columns, `features` (the flattened sample as one fixed-size
binary value of little-endian numbers in its own dtype: uint8 images stay uint8) and `label` (the
label as it appeared in the source), and a `meta.json` that records rows, sample shape, dtypes,
classes, the fields of rows written from dict items (`fields`, `label_key`: each field's name, shape
and dtype, concatenated in the row in that order) and the row count of every file and row group. The
row counts let each worker open only the row groups that hold its rows. Writers build the folder
under a temporary name and rename it at the end, so an interrupted write leaves no dataset behind;
the temporary name carries its owner, so one left by a killed writer goes at the next write to the
same folder (see `shoal.data.leftovers`). An existing folder is replaced (`overwrite`) only when it
is a shoal dataset, and atomically: the new one is renamed in once the old one is renamed aside,
which goes last; a symbolic link as the output folder is refused. Reads from a store are retried
when they fail in a way that may pass (`shoal.data.retry`), and reads for training refuse NaN and
infinity, naming the file and row, before they can turn into a NaN loss or NaN metrics.

Version 1 stored features as a fixed-size list column; Parquet decodes lists through two
levels per value, which made loading ~6x slower and ~5x larger in memory than one binary
value per row. Version 1 folders are still read.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from shoal.data import leftovers
from shoal.data.meta import FORMAT_NAME, FORMAT_VERSION, check_meta, number_dtype
from shoal.data.retry import after_failure, retried, transient
from shoal.durable import disk_full, replace_durably
from shoal.errors import DataError

ROW_GROUP_BYTES = 16 * 2**20  # the unit a worker reads: small enough to bound memory, large enough to stream
META_FILE = "meta.json"
MAX_CLASSES = 10_000


def _filesystem(path: str, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and in-filesystem path for a local path or a URI (or a path in `filesystem`)."""
    if filesystem is not None:
        return filesystem, path
    if "://" in path:
        try:
            return retried(lambda: pafs.FileSystem.from_uri(path), path)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as error:
            raise DataError(f"{path}: cannot open dataset store: {error}") from None
    return pafs.LocalFileSystem(), os.path.abspath(path)


@dataclass(frozen=True)
class FileInfo:
    """One Parquet file of a dataset and the row counts of its row groups."""

    name: str
    rows: int
    row_groups: tuple[int, ...]


class Dataset:
    """An opened dataset: its metadata, and reads of any row range."""

    def __init__(self, path: str, meta: dict[str, Any], filesystem: pafs.FileSystem | None = None):
        self.path = path
        self.meta = meta
        self.rows: int = meta["rows"]
        self.shape: tuple[int, ...] = tuple(meta["shape"])
        self.features: int = math.prod(self.shape)
        self.feature_dtype = number_dtype(meta["feature_dtype"], f"{path}/{META_FILE}")
        self.classes: list | None = meta.get("classes")
        self.labeled: bool = meta.get("labeled", True) is not False
        """False for rows imported without a label: they can be predicted, not trained or tested on."""
        self.feature_names: list[str] | None = meta.get("feature_names")
        self.fields: list[dict[str, Any]] | None = meta.get("fields")
        """Rows of dict items: each field's name, shape and dtype, in the row's order; None for other rows."""
        self.label_key: str | None = meta.get("label_key") if self.fields else None
        """The label's key in dict items (and in the loader's dict batches); None for other rows."""
        self.files = [FileInfo(f["name"], f["rows"], tuple(f["row_groups"])) for f in meta["files"]]
        self._filesystem, self._root = _filesystem(path, filesystem)
        self.opened: list[tuple[str, int]] = []  # (file, row group) pairs read, for tests and stats

    @property
    def num_classes(self) -> int | None:
        return None if self.classes is None else len(self.classes)

    def description_digest(self) -> Any:
        """A sha256 of meta.json's content (rows, files, row groups, shape, classes, lineage): tells
        apart two datasets of as many rows, and not one dataset from itself moved elsewhere."""
        return hashlib.sha256(json.dumps(self.meta, sort_keys=True).encode())

    def fingerprint(self) -> str:
        """A digest of the description and of every file's size and modification time.

        Any rewrite of the dataset changes it, so a cache made from the dataset is reused only
        while the dataset is unchanged.
        """
        digest = self.description_digest()
        paths = [f"{self._root}/{info.name}" for info in self.files]
        try:
            stats = retried(lambda: self._filesystem.get_file_info(paths), self.path)
        except (OSError, pa.ArrowException) as error:
            raise DataError(f"{self.path}: cannot list the dataset's files: {error}") from None
        for info, stat in zip(self.files, stats, strict=True):
            if stat.type == pafs.FileType.NotFound:
                raise DataError(f"{self.path}/{info.name}: missing (listed in {META_FILE})")
            digest.update(f"{info.name}:{stat.size}:{stat.mtime_ns}".encode())
        return digest.hexdigest()

    def schema_key(self) -> tuple:
        """What two datasets must share to be used together as train and test sets."""
        return (self.shape, str(self.feature_dtype), self.classes)

    def label_indices(self, labels: np.ndarray, where: str) -> np.ndarray:
        """Map raw labels to class indices 0..K-1; a label outside the classes is an error."""
        if self.classes is None:
            return labels.astype(np.float32)
        classes = np.asarray(self.classes)
        index = np.searchsorted(classes, labels)
        index = np.clip(index, 0, len(classes) - 1)
        bad = classes[index] != labels
        if bad.any():
            label = labels[bad][0]
            label = label.item() if hasattr(label, "item") else label
            raise DataError(f"{where}: label {label!r} is not one of the classes {self.classes}")
        return index.astype(np.int64)

    def read_rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Features (stop-start, *shape) in their stored dtype and class indices of rows [start, stop).

        These rows are trained or evaluated on: a NaN or infinite value is a `DataError`.
        """
        features = np.empty((stop - start, *self.shape), dtype=self.feature_dtype)
        flat = features.reshape(stop - start, self.features)
        labels: list[np.ndarray] = []
        for position, block, label in self.iter_rows(start, stop, finite=True):
            flat[position : position + len(block)] = block
            labels.append(label)
        raw = np.concatenate(labels) if labels else np.empty(0)
        return features, self.label_indices(raw, f"{self.path}")

    def iter_rows(
        self, start: int, stop: int, max_rows: int | None = None, *, finite: bool = False
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Rows [start, stop) in pieces: (position in the range, flat features, raw labels).

        Only the row groups that overlap the range are read. With `max_rows`, a row group is
        read in batches of at most that many rows, so memory stays bounded by the batch, not
        the row group. With `finite`, a NaN or infinity among the features (or a regression
        target) is a `DataError` naming the file and the row.
        """
        if not 0 <= start <= stop <= self.rows:
            raise ValueError(f"row range [{start}, {stop}) outside 0..{self.rows}")
        first = 0  # dataset row of the current file's first row
        for info in self.files:
            lo, hi = max(start, first), min(stop, first + info.rows)
            if lo < hi:
                for row, block, label in self._read_file(info, first, lo, hi, max_rows):
                    if finite:
                        self._check_finite(info, first, row, block, label)
                    yield row - start, block, label
            first += info.rows

    def _read_file(
        self, info: FileInfo, first: int, lo: int, hi: int, max_rows: int | None
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Rows [lo, hi) of the file whose first row is dataset row `first`: (dataset row, features, labels).

        A transient store error opens the file again and goes on from the first row not yet
        given, after a pause; `TRIES` failures in a row are a `StoreError`.
        """
        where, failures = f"{self.path}/{info.name}", 0
        while True:
            try:
                with self._filesystem.open_input_file(f"{self._root}/{info.name}") as handle:
                    parquet = pq.ParquetFile(handle)
                    group_first = first
                    for group, group_rows in enumerate(info.row_groups):
                        a, b = max(lo, group_first), min(hi, group_first + group_rows)
                        if a < b:
                            self.opened.append((info.name, group))
                            for row, block, label in self._read_group(parquet, group, group_first, a, b, max_rows):
                                yield row, block, label
                                lo, failures = row + len(block), 0
                        group_first += group_rows
                return
            except OSError as error:
                if not transient(error):
                    raise DataError(f"{where}: cannot read Parquet file: {error}") from None
                failures = after_failure(error, failures, where)
            except (pa.ArrowException, ValueError) as error:
                raise DataError(f"{where}: cannot read Parquet file: {error}") from None

    def _read_group(
        self, parquet: pq.ParquetFile, group: int, offset: int, lo: int, hi: int, max_rows: int | None
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Rows [lo, hi) of the row group that begins at dataset row `offset`: (dataset row, features, labels)."""
        if max_rows is None:
            tables = iter([parquet.read_row_group(group, columns=["features", "label"])])
        else:
            tables = parquet.iter_batches(batch_size=max(1, max_rows), row_groups=[group],
                                          columns=["features", "label"], use_threads=False)
        first = offset  # dataset row of the first row of the next table
        for table in tables:
            count = table.num_rows
            a, b = max(lo, first), min(hi, first + count)
            if a < b:
                block = self._feature_block(table.column("features"), count)
                label = column_values(table.column("label"))
                yield a, block[a - first : b - first], label[a - first : b - first]
            first += count
            if first >= hi:
                break

    def _check_finite(self, info: FileInfo, first: int, row: int, block: np.ndarray, label: np.ndarray) -> None:
        """Refuse a piece of rows (the first at dataset row `row`) holding a NaN or infinity."""
        for values, what in ((block, "feature"), (label if self.classes is None else None, "label")):
            bad = first_non_finite(values)
            if bad is not None:
                at, value = row + bad[0] + 1, bad[1]  # counted from 1, as the importers count rows
                raise DataError(f"{self.path}/{info.name}: row {at} of the dataset (row {at - first} of the file) "
                                f"holds a non-finite {what} ({value}): fix or drop it at the source and import again")

    def _feature_block(self, column: pa.Array | pa.ChunkedArray, count: int) -> np.ndarray:
        """(count, features) in the stored dtype, without a copy where the column allows."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_fixed_size_binary(column.type):  # version 2: one value of row bytes per row
            dtype = self.feature_dtype.newbyteorder("<")
            return np.frombuffer(column.buffers()[1], dtype=dtype, count=count * self.features,
                                 offset=column.offset * column.type.byte_width).reshape(count, self.features)
        values = column.flatten()  # version 1: a fixed-size list per row
        return values.to_numpy(zero_copy_only=False).reshape(count, self.features)

    def read_all(self) -> tuple[np.ndarray, np.ndarray]:
        return self.read_rows(0, self.rows)


def column_values(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column as NumPy; numbers without nulls straight from the Arrow buffer.

    pyarrow's `to_numpy` imports pandas whenever pandas is installed, which costs every worker
    half a second and tens of MB at its first batch; strings, booleans and nulls still go through it.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = "i" if pa.types.is_signed_integer(column.type) else "u" if pa.types.is_unsigned_integer(column.type) \
        else "f" if pa.types.is_floating(column.type) else None
    if kind is None or column.null_count:
        return column.to_numpy(zero_copy_only=False)
    dtype = np.dtype(f"<{kind}{column.type.bit_width // 8}")
    return np.frombuffer(column.buffers()[1], dtype=dtype, count=len(column), offset=column.offset * dtype.itemsize)


def first_non_finite(values: np.ndarray | None) -> tuple[int, float] | None:
    """(row, value) of the first NaN or infinity in a (rows, ...) array; None when there is none.

    One vectorized pass over the piece just read; integers and booleans cannot hold either.
    """
    if values is None or values.dtype.kind not in "fc" or not len(values):
        return None
    finite = np.isfinite(values).reshape(len(values), -1)
    if finite.all():
        return None
    row = int(np.flatnonzero(~finite.all(axis=1))[0])
    return row, float(values.reshape(len(values), -1)[row][~finite[row]][0])


def open_dataset(path: str, filesystem: pafs.FileSystem | None = None) -> Dataset:
    """Open a dataset folder, checking `meta.json`; errors name the file (and key) at fault.

    `filesystem`, a pyarrow filesystem, reads `path` inside it instead of the store a URI names.
    """
    path = str(path)
    store, root = _filesystem(path, filesystem)
    try:
        info = retried(lambda: store.get_file_info(root), path)
    except OSError as error:
        raise DataError(f"{path}: cannot open the dataset: {error}") from None
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"{path}: dataset not found")
    if info.type != pafs.FileType.Directory:
        raise DataError(f"{path}: not a dataset folder (import data with 'shoal data import')")
    where = f"{path}/{META_FILE}"
    try:
        content = retried(lambda: _read_whole(store, f"{root}/{META_FILE}"), where)
    except FileNotFoundError:
        raise DataError(f"{where}: missing (import data with 'shoal data import')") from None
    except OSError as error:
        raise DataError(f"{where}: cannot read: {error}") from None
    try:
        meta = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise DataError(f"{where}: corrupt: {error}") from None
    check_meta(meta, where)
    return Dataset(path, meta, filesystem)


def _read_whole(filesystem: pafs.FileSystem, path: str) -> bytes:
    with filesystem.open_input_stream(path) as stream:
        return stream.read()


def check_output(path: str, overwrite: bool, shown: str | None = None) -> None:
    """`path` may become a dataset folder: absent, or (with `overwrite`) a shoal dataset to replace; never a
    link, a file, or a folder holding anything but a dataset's files (`shown`: the path as the user gave it)."""
    shown = shown or path
    if os.path.islink(path):
        raise DataError(f"{shown}: a symbolic link; shoal writes a dataset into a folder of its own, never through "
                        "a link (choose another output folder)")
    if not os.path.exists(path):
        return
    if not overwrite:
        raise DataError(f"{shown}: already exists (choose another output folder)")
    if not is_dataset_folder(path):
        raise DataError(f"{shown}: not a shoal dataset (a {META_FILE} of format {FORMAT_NAME!r} and Parquet files, "
                        "nothing else), so --force will not delete it: remove it yourself or choose another "
                        "output folder")


def is_dataset_folder(path: str) -> bool:
    """Whether `path` is a folder shoal wrote as a dataset: its meta.json says so, and it holds only its files."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    for entry in os.scandir(path):
        if not (entry.is_file(follow_symlinks=False) and (entry.name == META_FILE or entry.name.endswith(".parquet"))):
            return False
    try:
        with open(os.path.join(path, META_FILE), "rb") as handle:
            meta = json.load(handle)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT_NAME and isinstance(meta.get("files"), list)


def full_disk(path: str) -> DataError:
    return DataError(f"{path}: the disk is full; nothing was written (free some space, then write it again)")


class DatasetWriter:
    """Streams batches of rows into a new dataset folder, made visible only by `close()`.

    Use as a context manager: leaving the block with an exception removes the temporary folder,
    so a failed import leaves nothing behind. The classes are the labels seen, unless `classes`
    fixes them: a dataset derived from another keeps its parent's classes, even one it holds no
    row of, and a label outside them is an error.
    """

    def __init__(
        self,
        path: str,
        shape: tuple[int, ...],
        feature_dtype: np.dtype | str,
        *,
        rows_per_file: int = 1_000_000,
        row_group_size: int | None = None,
        classification: bool = True,
        feature_names: list[str] | None = None,
        extra_meta: dict[str, Any] | None = None,
        overwrite: bool = False,
        classes: list | None = None,
        labeled: bool = True,
    ):
        if "://" in str(path):
            raise DataError(f"{path}: datasets are written to local folders (copy the folder to the store after)")
        self.path = os.path.abspath(path)
        self.shown = str(path)  # as the user gave it: messages never name the temporary folder
        check_output(self.path, overwrite, self.shown)
        self.shape = tuple(int(s) for s in shape)
        self.features = math.prod(self.shape)
        self.feature_dtype = np.dtype(feature_dtype)
        self.rows_per_file = rows_per_file
        row_bytes = self.features * self.feature_dtype.itemsize
        self.row_group_size = row_group_size or max(1, min(65_536, ROW_GROUP_BYTES // row_bytes))
        self.labeled = labeled  # without labels: rows to predict, not to train on
        self.classification = classification and labeled
        self.feature_names = feature_names
        self.extra_meta = extra_meta or {}
        self.overwrite = overwrite
        self._files: list[dict[str, Any]] = []
        self._writer: pq.ParquetWriter | None = None
        self._file_rows = 0
        self._row_groups: list[int] = []
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_rows = 0
        self._labels: set = set()
        self._label_kind: str | None = None
        self._fixed_classes = None if classes is None else sorted(classes)
        if classes is not None:
            self.classification = True
            self._labels = set(classes)
        self.rows = 0
        parent, name = os.path.split(self.path)  # last: nothing above may fail once the folder exists
        os.makedirs(parent, exist_ok=True)
        leftovers.sweep(parent, f".{name}.")  # what killed writers left here
        self._temporary = os.path.join(parent, leftovers.owned_name(f".{name}"))
        os.makedirs(self._temporary)
        leftovers.remove_on_stop(self._temporary)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            try:
                self.close()
            except BaseException as error:
                self.abort()  # close() failing (a full disk, say) must not leave the folder behind either
                if disk_full(error):
                    raise full_disk(self.shown) from None
                raise
        else:
            self.abort()
            if disk_full(value):
                raise full_disk(self.shown) from None

    def write(self, features: np.ndarray, labels: np.ndarray | None = None) -> None:
        """Append rows: features (n, *shape) or (n, prod(shape)), labels (n,) (None for an unlabeled dataset)."""
        features = np.ascontiguousarray(features, dtype=self.feature_dtype).reshape(len(features), self.features)
        if (labels is None) == self.labeled:
            raise ValueError("labels are given exactly when the dataset is labeled")
        labels = np.zeros(len(features), dtype=np.int8) if labels is None else np.asarray(labels)
        if len(labels) != len(features):
            raise ValueError("features and labels differ in length")
        if self.classification:
            self._track_labels(labels)
        self._pending.append((features, labels))
        self._pending_rows += len(features)
        while self._pending_rows >= self._group_target():
            self._flush_group(self._group_target())

    def _group_target(self) -> int:
        return min(self.row_group_size, self.rows_per_file - self._file_rows)

    def _track_labels(self, labels: np.ndarray) -> None:
        if self._fixed_classes is not None:
            unknown = set(np.unique(labels).tolist()) - self._labels
            if unknown:
                raise DataError(f"{self.path}: label {sorted(unknown)[0]!r} is not one of the classes "
                                f"{self._fixed_classes}")
            return
        kind = "string" if labels.dtype.kind in "USO" else ("int" if labels.dtype.kind in "iub" else "float")
        if kind == "float" and len(labels) and not np.all(np.isfinite(labels) & (labels == np.round(labels))):
            if self._label_kind == "int" and self.rows:
                raise DataError(f"{self.path}: labels are whole numbers in the first {self.rows:,} rows, "
                                "fractional later: write a regression target with a decimal point throughout")
            self.classification = False  # non-integer numbers: a regression target, not classes
            self._labels.clear()
            return
        if self._label_kind not in (None, kind) and "string" in (self._label_kind, kind):
            raise DataError(f"{self.path}: labels mix text and numbers")
        self._label_kind = kind if self._label_kind in (None, kind) else "float"
        self._labels.update(np.unique(labels).tolist())
        if len(self._labels) > MAX_CLASSES:
            raise DataError(f"{self.path}: more than {MAX_CLASSES} distinct labels; is the label column right?")

    def _flush_group(self, count: int) -> None:
        taken_features, taken_labels, need = [], [], count
        while need:
            features, labels = self._pending[0]
            if len(features) <= need:
                self._pending.pop(0)
            else:
                self._pending[0] = (features[need:], labels[need:])
                features, labels = features[:need], labels[:need]
            taken_features.append(features)
            taken_labels.append(labels)
            need -= len(features)
        self._pending_rows -= count
        features = np.concatenate(taken_features)
        labels = np.concatenate(taken_labels)
        if labels.dtype.kind == "O":
            labels = labels.astype(str)
        data = np.ascontiguousarray(features, dtype=self.feature_dtype.newbyteorder("<"))
        rows = pa.FixedSizeBinaryArray.from_buffers(pa.binary(data.itemsize * self.features), count,
                                                    [None, pa.py_buffer(data)])
        table = pa.table({"features": rows, "label": pa.array(labels)})
        if self._writer is None:
            name = f"part-{len(self._files):05d}.parquet"
            self._writer = pq.ParquetWriter(os.path.join(self._temporary, name), table.schema,
                                            use_dictionary=["label"], write_statistics=["label"])
            self._files.append({"name": name})
        elif not table.schema.equals(self._writer.schema):
            table = table.cast(self._writer.schema)
        self._writer.write_table(table, row_group_size=count)
        self._row_groups.append(count)
        self._file_rows += count
        self.rows += count
        if self._file_rows >= self.rows_per_file:
            self._close_file()

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._files[-1].update(rows=self._file_rows, row_groups=self._row_groups)
            self._writer, self._file_rows, self._row_groups = None, 0, []

    def close(self) -> None:
        """Write the remaining rows and `meta.json`, then rename the folder into place."""
        while self._pending_rows:
            self._flush_group(min(self._pending_rows, self._group_target()))
        self._close_file()
        if self.rows == 0:
            self.abort()
            raise DataError(f"{self.path}: no rows to write: the source is empty")
        classes = sorted(self._labels) if self.classification else None  # fixed classes are in _labels too
        meta = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "rows": self.rows,
            "shape": list(self.shape),
            "feature_dtype": self.feature_dtype.name,
            "classes": classes,
            **({} if self.labeled else {"labeled": False}),
            "feature_names": self.feature_names,
            "files": self._files,
            **self.extra_meta,
        }
        with open(os.path.join(self._temporary, META_FILE), "w") as handle:
            json.dump(meta, handle, indent=1)
        try:
            check_output(self.path, self.overwrite, self.shown)  # again: the folder may have changed meanwhile
        except DataError:
            self.abort()
            raise
        self._move_in()
        leftovers.release(self._temporary)

    def _move_in(self) -> None:
        """Rename the finished folder into place; a dataset already there is renamed aside first and removed
        last, so at every moment one whole dataset is on disk (never deleted, then renamed)."""
        if not os.path.lexists(self.path):
            replace_durably(self._temporary, self.path)  # every file on disk before the dataset counts
            return
        parent, name = os.path.split(self.path)
        aside = os.path.join(parent, f".{name}.replaced-{uuid.uuid4().hex[:12]}")  # kept, not swept, if we die here
        os.rename(self.path, aside)
        try:
            replace_durably(self._temporary, self.path)
        except BaseException:
            os.rename(aside, self.path)
            raise
        shutil.rmtree(aside, ignore_errors=True)

    def abort(self) -> None:
        """Drop everything written so far."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        shutil.rmtree(self._temporary, ignore_errors=True)
        leftovers.release(self._temporary)
