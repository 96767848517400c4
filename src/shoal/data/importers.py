"""Importers: convert CSV, LIBSVM, MNIST IDX, NumPy, HDF5 and Parquet files into a dataset folder.

Every importer streams: it reads its source in chunks and hands each chunk to `DatasetWriter`,
so memory stays flat however large the input is, and a failure part-way leaves no output
folder behind (the writer removes its temporary folder). Errors about the input are
`DataError`s that name the file and, where there is one, the line or row at fault. This module
holds the dispatch, what every importer shares, and the LIBSVM and NumPy formats; CSV, IDX,
HDF5 and Parquet live in `import_csv`, `import_idx`, `import_hdf5` and `import_parquet`
(imported when used, so h5py loads only for HDF5), one-hot encoding in `encoding`.
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Iterator, Sequence
from typing import IO, Any

import numpy as np
import numpy.lib.format as npy_format

from shoal.data.declared_classes import DeclaredClasses
from shoal.data.encoding import Encoding, Locate, shown
from shoal.data.format import ROW_GROUP_BYTES, Dataset, DatasetWriter, open_dataset
from shoal.errors import DataError

FORMATS = ("csv", "libsvm", "idx", "npy", "npz", "hdf5", "parquet")
TABLE_FORMATS = ("csv", "parquet")  # formats with named columns, which can be one-hot encoded

# Bytes of dense features per chunk handed to the writer, and per row group the writer buffers:
# together they bound an import's memory however large the source is.
CHUNK_BYTES = 32 * 1024 * 1024
ROW_GROUP_ROWS = 65_536
LIBSVM_CHUNK_LINES = 20_000
LIBSVM_MAX_INDEX = 2**31 - 1  # rows are stored dense: a row this wide could not be written anyway
CSV_BLOCK_BYTES = 4 * 1024 * 1024  # the text Arrow parses at a time (import_csv)


def import_dataset(
    source: str,
    out: str,
    format: str,
    *,
    n_features: int | None = None,
    label: str | None = None,
    features: str | None = None,
    categorical: Sequence[str] | None = None,
    encoding_from: str | None = None,
    classes: Sequence[str] | None = None,
    rows_per_file: int = 1_000_000,
    overwrite: bool = False,
) -> Dataset:
    """Convert `source` (a `format` file) into the dataset folder `out` and open it.

    `n_features` fixes the feature count (LIBSVM: otherwise the largest index seen; other
    formats: checked against the file). `label` names the label column of a CSV or Parquet
    table (a name or a 0-based column number; default the last column), the labels file of a
    features `.npy` or IDX file, or the labels dataset of an HDF5 file, whose features dataset
    `features` names. `categorical` lists the table columns to one-hot encode (names or
    numbers); `encoding_from`, a dataset folder, makes a table encode as that dataset did.
    `classes` lists the allowed labels: a row with any other label fails the import.
    """
    source, out = str(source), str(out)
    if format not in FORMATS:
        raise DataError(f"unknown import format {format!r}; supported formats: {', '.join(FORMATS)}")
    check_file(source)
    if n_features is not None and n_features < 1:
        raise DataError(f"{source}: n_features must be at least 1, got {n_features}")
    if rows_per_file < 1:
        raise DataError(f"{out}: rows_per_file must be at least 1, got {rows_per_file}")
    if (categorical or encoding_from is not None) and format not in TABLE_FORMATS:
        raise DataError(f"{source}: categorical columns and encoding_from apply to csv and parquet, not {format}")
    if categorical and encoding_from is not None:
        raise DataError(f"{source}: give categorical columns or encoding_from, not both "
                        "(the reference encoding names its categorical columns)")
    if features is not None and format != "hdf5":
        raise DataError(f"{source}: features names an HDF5 dataset; it does not apply to {format}")
    # Checked here as well as in the writer so that a long first pass is not wasted.
    if os.path.exists(out) and not overwrite:
        raise DataError(f"{out}: already exists (choose another output folder)")
    declared = None if classes is None else DeclaredClasses(classes)
    encoding = None if encoding_from is None else Encoding.from_dataset(str(encoding_from))
    writer_options = {"rows_per_file": rows_per_file, "overwrite": overwrite, "declared": declared}
    if format == "libsvm":
        _import_libsvm(source, out, n_features, writer_options)
    elif format == "csv":
        from shoal.data.import_csv import import_csv

        import_csv(source, out, n_features, label, list(categorical or ()), encoding, writer_options)
    elif format in ("npy", "npz"):
        _import_numpy(source, out, n_features, label, writer_options, archive=format == "npz")
    elif format == "idx":
        from shoal.data.import_idx import import_idx

        import_idx(source, out, n_features, label, writer_options)
    elif format == "hdf5":
        from shoal.data.import_hdf5 import import_hdf5

        import_hdf5(source, out, n_features, features, label, writer_options)
    else:
        from shoal.data.import_parquet import import_parquet

        import_parquet(source, out, n_features, label, list(categorical or ()), encoding, writer_options)
    return open_dataset(out)


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

    def write(self, features: np.ndarray, labels: np.ndarray) -> None:
        if self.declared is not None:
            self.declared.check(labels, self.handed, self.locate)
        self.handed += len(labels)
        super().write(features, labels)


def import_writer(
    out: str, shape: tuple[int, ...], dtype: np.dtype, options: dict[str, Any], *, locate: Locate, **more: Any
) -> ImportWriter:
    """An `ImportWriter` whose row groups stay within `ROW_GROUP_BYTES`, however wide the rows."""
    row_bytes = math.prod(shape) * np.dtype(dtype).itemsize
    group_rows = max(1, min(ROW_GROUP_ROWS, ROW_GROUP_BYTES // row_bytes))
    return ImportWriter(out, shape, dtype, row_group_size=group_rows, locate=locate, **options, **more)


def row_locator(source: str) -> Locate:
    """Names row `row` (0-based) of a binary source as `file: row N` (1-based)."""
    return lambda row: f"{source}: row {row + 1}"


def source_meta(format: str, source: str, **more: Any) -> dict[str, Any]:
    return {"source": {"format": format, "path": os.path.abspath(source), **more}}


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


def offset_locator(locate: Locate, first_row: int) -> Locate:
    """`locate` for rows counted from `first_row`, as rows of a batch are."""
    return lambda row: locate(first_row + row)


# LIBSVM ------------------------------------------------------------------------------------


class _LibsvmChunk:
    """The parsed rows of a run of LIBSVM lines, in sparse form."""

    def __init__(self, labels: np.ndarray, counts: np.ndarray, indices: np.ndarray, values: np.ndarray):
        self.labels = labels  # int64 when every label is an integer, else float64
        self.counts = counts  # pairs per row
        self.indices = indices  # 1-based
        self.values = values

    def dense(self, n_features: int) -> np.ndarray:
        features = np.zeros((len(self.labels), n_features), dtype=np.float32)
        rows = np.repeat(np.arange(len(self.labels)), self.counts)
        features[rows, self.indices - 1] = self.values
        return features


def _import_libsvm(source: str, out: str, n_features: int | None, writer_options: dict[str, Any]) -> None:
    # First pass: check every line and learn the feature count and the label type, so that
    # the second pass writes one consistent schema and cannot fail on bad input.
    largest_index, integer_labels, rows = 0, True, 0
    for chunk in _libsvm_chunks(source, n_features, LIBSVM_CHUNK_LINES):
        if len(chunk.indices):
            largest_index = max(largest_index, int(chunk.indices.max()))
        integer_labels = integer_labels and chunk.labels.dtype.kind == "i"
        rows += len(chunk.labels)
    if rows == 0:
        raise DataError(f"{source}: no data lines: the source is empty")
    features = n_features if n_features is not None else largest_index
    if features == 0:
        raise DataError(f"{source}: no feature appears on any line; pass n_features")
    chunk_lines = max(1, min(LIBSVM_CHUNK_LINES, CHUNK_BYTES // (4 * features)))
    meta = source_meta("libsvm", source)
    locate = _libsvm_locator(source)
    with import_writer(out, (features,), np.float32, writer_options, locate=locate, extra_meta=meta) as writer:
        for chunk in _libsvm_chunks(source, features, chunk_lines):
            labels = chunk.labels if integer_labels else chunk.labels.astype(np.float64)
            writer.write(chunk.dense(features), labels)


def _libsvm_locator(source: str) -> Locate:
    """Names data row `row` (0-based; comments and blank lines hold none) as `file:line`."""

    def locate(row: int) -> str:
        with open(source, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                if line.split("#", 1)[0].strip():
                    if row == 0:
                        return f"{source}:{number}"
                    row -= 1
        return source

    return locate


def _libsvm_chunks(source: str, n_features: int | None, chunk_lines: int) -> Iterator[_LibsvmChunk]:
    """Parsed chunks of `chunk_lines` lines; a bad line raises `DataError` naming it."""
    try:
        with open(source, encoding="utf-8") as handle:
            first, lines = 1, []
            for number, line in enumerate(handle, 1):
                lines.append(line)
                if len(lines) == chunk_lines:
                    yield _parse_libsvm(source, first, lines, n_features)
                    first, lines = number + 1, []
            if lines:
                yield _parse_libsvm(source, first, lines, n_features)
    except UnicodeDecodeError as error:
        raise DataError(f"{source}: not UTF-8 text ({error.reason} at byte {error.start} of a block)") from None
    except OSError as error:
        raise DataError(f"{source}: cannot read: {error.strerror or error}") from None


def _parse_libsvm(source: str, first: int, lines: list[str], n_features: int | None) -> _LibsvmChunk:
    """Parse lines numbered from `first`: vectorised, with a line-by-line pass to name a bad line."""
    labels, counts, pairs = [], [], []
    for line in lines:
        if "#" in line:
            line = line[: line.index("#")]
        tokens = line.split()
        if tokens:
            labels.append(tokens[0])
            counts.append(len(tokens) - 1)
            pairs.append(" ".join(tokens[1:]))
    joined = " ".join(pair for pair in pairs if pair)
    try:
        if not _well_formed_pairs(joined, sum(counts)):
            raise ValueError("malformed pair")
        numbers = joined.replace(":", " ").split()
        # Python's int() and float() decide what a number is, here and in the line-by-line pass.
        indices = np.array(list(map(int, numbers[0::2])), dtype=np.int64)
        values = np.array(list(map(float, numbers[1::2])), dtype=np.float64)
        if len(indices) and (indices.min() < 1 or indices.max() > (n_features or LIBSVM_MAX_INDEX)):
            raise ValueError("index out of range")
        parsed_labels = _parse_labels(labels)
    except (ValueError, OverflowError):
        pass
    else:
        return _LibsvmChunk(parsed_labels, np.array(counts, dtype=np.int64), indices, values.astype(np.float32))
    _raise_libsvm_error(source, first, lines, n_features)
    # The line-by-line pass names the culprit; should it ever not, name the lines at least.
    raise DataError(f"{source}:{first}-{first + len(lines) - 1}: cannot parse these lines")


def _well_formed_pairs(joined: str, count: int) -> bool:
    """Whether `joined` is `count` space-separated `index:value` tokens, each with exactly one colon.

    Done on the bytes with numpy: separators must alternate space, colon, space, ... and no two
    may touch, which a per-token check in Python would spend most of the parse time on.
    """
    if count == 0:
        return True
    text = np.frombuffer(f" {joined} ".encode(), dtype=np.uint8)
    positions = np.flatnonzero((text == ord(" ")) | (text == ord(":")))
    separators = text[positions]
    return (
        len(separators) == 2 * count + 1
        and bool(np.all(separators[0::2] == ord(" ")))
        and bool(np.all(separators[1::2] == ord(":")))
        and bool(np.all(np.diff(positions) > 1))
    )


def _parse_labels(labels: list[str]) -> np.ndarray:
    """Integers when every label is one (`-1`, `+1`, `0`), else floats."""
    try:
        return np.array(list(map(int, labels)), dtype=np.int64)
    except (ValueError, OverflowError):
        return np.array(list(map(float, labels)), dtype=np.float64)


def _raise_libsvm_error(source: str, first: int, lines: list[str], n_features: int | None) -> None:
    """Check lines one at a time and raise `DataError(file:line: what)` for the first bad one."""
    for number, line in enumerate(lines, first):
        if "#" in line:
            line = line[: line.index("#")]
        tokens = line.split()
        if not tokens:
            continue
        where = f"{source}:{number}"
        try:
            float(tokens[0])
        except ValueError:
            raise DataError(f"{where}: label {tokens[0]!r} is not a number (a line starts with its label)") from None
        for token in tokens[1:]:
            index_text, colon, value_text = token.partition(":")
            if not colon or not index_text or not value_text or ":" in value_text:
                raise DataError(f"{where}: malformed pair {token!r} (expected index:value)")
            try:
                index = int(index_text)
            except ValueError:
                raise DataError(f"{where}: index {index_text!r} is not an integer") from None
            if index < 1:
                raise DataError(f"{where}: index {index} is below 1 (LIBSVM indices start at 1)")
            if n_features is not None and index > n_features:
                raise DataError(f"{where}: index {index} is above the feature count {n_features}")
            if index > LIBSVM_MAX_INDEX:
                raise DataError(f"{where}: index {index} is above the largest supported, {LIBSVM_MAX_INDEX}")
            try:
                float(value_text)
            except ValueError:
                raise DataError(f"{where}: value {value_text!r} of index {index} is not a number") from None


# NumPy -------------------------------------------------------------------------------------


def _import_numpy(
    source: str, out: str, n_features: int | None, label: str | None, writer_options: dict[str, Any], archive: bool
) -> None:
    """A features `.npy` with a labels `.npy`, or one `.npz` holding `x` and `y` (format npy takes either)."""
    if zipfile.is_zipfile(source):
        _import_npz(source, out, n_features, writer_options)
        return
    if archive:
        raise DataError(f"{source}: not a .npz archive (a zip file of .npy arrays)")
    if label is None:
        raise DataError(f"{source}: a features .npy needs its labels: pass the labels .npy as label")
    check_file(label)
    features = _load_npy(source)
    labels = _load_npy(label)
    sample_shape = sample_shape_of(source, features.shape, features.dtype, n_features)
    labels_dtype = labels_dtype_of(label, labels.shape, labels.dtype)
    if len(labels) != len(features):
        raise DataError(f"{source} has {len(features)} samples but {label} has {len(labels)} labels")
    if len(features) == 0:
        raise DataError(f"{source}: holds no samples: the source is empty")
    rows = rows_per_chunk(sample_shape, features.dtype)
    meta = source_meta("npy", source, labels=os.path.abspath(label))
    dtype = stored_dtype(features.dtype)
    with import_writer(out, sample_shape, dtype, writer_options, locate=row_locator(label), extra_meta=meta) as writer:
        for start in range(0, len(features), rows):
            labels_chunk = np.asarray(labels[start : start + rows]).reshape(-1).astype(labels_dtype)
            writer.write(np.asarray(features[start : start + rows]), labels_chunk)


def _load_npy(path: str) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise DataError(f"{path}: not a readable NumPy .npy file ({error})") from None


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


def rows_per_chunk(sample_shape: tuple[int, ...], dtype: np.dtype) -> int:
    return max(1, CHUNK_BYTES // (math.prod(sample_shape) * max(dtype.itemsize, 4)))


def _import_npz(source: str, out: str, n_features: int | None, writer_options: dict[str, Any]) -> None:
    """Stream arrays `x` and `y` out of the archive, compressed or not, without loading them."""
    try:
        with zipfile.ZipFile(source) as archive:
            names = set(archive.namelist())
            missing = [f"{name}.npy" for name in ("x", "y") if f"{name}.npy" not in names]
            if missing:
                held = ", ".join(sorted(name.removesuffix(".npy") for name in names)) or "nothing"
                raise DataError(f"{source}: a .npz import needs arrays 'x' and 'y'; it holds {held}")
            with archive.open("x.npy") as features_file, archive.open("y.npy") as labels_file:
                features_shape, features_dtype = _npy_member_header(source, "x", features_file)
                labels_shape, labels_dtype = _npy_member_header(source, "y", labels_file)
                sample_shape = sample_shape_of(f"{source} (x)", features_shape, features_dtype, n_features)
                labels_target = labels_dtype_of(f"{source} (y)", labels_shape, labels_dtype)
                if labels_shape[0] != features_shape[0]:
                    raise DataError(f"{source}: x has {features_shape[0]} samples but y has {labels_shape[0]} labels")
                rows = rows_per_chunk(sample_shape, features_dtype)
                meta = source_meta("npz", source)
                dtype = stored_dtype(features_dtype)
                if features_shape[0] == 0:
                    raise DataError(f"{source}: x holds no samples: the source is empty")
                locate = row_locator(f"{source} (y)")
                with import_writer(out, sample_shape, dtype, writer_options, locate=locate, extra_meta=meta) as writer:
                    for start in range(0, features_shape[0], rows):
                        count = min(rows, features_shape[0] - start)
                        features = _read_rows(source, "x", features_file, features_dtype, (count, *sample_shape))
                        labels = _read_rows(source, "y", labels_file, labels_dtype, (count,))
                        writer.write(features, labels.astype(labels_target))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as error:
        raise DataError(f"{source}: cannot read the .npz archive: {error}") from None


def _npy_member_header(source: str, name: str, handle: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    try:
        version = npy_format.read_magic(handle)
        if version == (1, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_1_0(handle)
        elif version == (2, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_2_0(handle)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except ValueError as error:
        raise DataError(f"{source}: array {name!r} is not a readable .npy member ({error})") from None
    if dtype.hasobject:
        raise DataError(f"{source}: array {name!r} holds Python objects; save numbers or text")
    if fortran_order and len(shape) > 1:
        # Rows of a column-major array are not contiguous, so it cannot be read a chunk at a time.
        raise DataError(f"{source}: array {name!r} is stored column-major; save np.ascontiguousarray({name})")
    return tuple(shape), dtype


def _read_rows(source: str, name: str, handle: IO[bytes], dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    size = math.prod(shape) * dtype.itemsize
    data = bytearray()
    while len(data) < size:
        block = handle.read(size - len(data))
        if not block:
            raise DataError(f"{source}: array {name!r} is truncated")
        data += block
    return np.frombuffer(data, dtype=dtype).reshape(shape)
