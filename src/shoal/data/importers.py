"""Importers: convert LIBSVM, CSV and NumPy files into a dataset folder.

Every importer streams: it reads its source in chunks and hands each chunk to `DatasetWriter`,
so memory stays flat however large the input is, and a failure part-way leaves no output
folder behind (the writer removes its temporary folder). Errors about the input are
`DataError`s that name the file and, where there is one, the line at fault.
"""

from __future__ import annotations

import csv
import math
import os
import re
import zipfile
from collections.abc import Callable, Iterator
from typing import IO, Any

import numpy as np
import numpy.lib.format as npy_format
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from shoal.data.format import Dataset, DatasetWriter, open_dataset
from shoal.errors import DataError

FORMATS = ("csv", "libsvm", "npy")

# Bytes of dense features per chunk handed to the writer, and per row group the writer buffers:
# together they bound an import's memory however large the source is.
CHUNK_BYTES = 32 * 1024 * 1024
ROW_GROUP_BYTES = 64 * 1024 * 1024
ROW_GROUP_ROWS = 65_536
LIBSVM_CHUNK_LINES = 20_000
LIBSVM_MAX_INDEX = 2**31 - 1  # rows are stored dense: a row this wide could not be written anyway
CSV_BLOCK_BYTES = 4 * 1024 * 1024


def import_dataset(
    source: str,
    out: str,
    format: str,
    *,
    n_features: int | None = None,
    label: str | None = None,
    rows_per_file: int = 1_000_000,
    overwrite: bool = False,
) -> Dataset:
    """Convert `source` (a `format` file) into the dataset folder `out` and open it.

    `n_features` fixes the feature count (LIBSVM: otherwise the largest index seen; CSV and
    NumPy: checked against the file). `label` names the label column of a CSV file (a name or
    a column number; default the last column) or the labels `.npy` of a features `.npy`.
    """
    source, out = str(source), str(out)
    if format not in FORMATS:
        raise DataError(f"unknown import format {format!r}; supported formats: {', '.join(FORMATS)}")
    _check_file(source)
    if n_features is not None and n_features < 1:
        raise DataError(f"{source}: n_features must be at least 1, got {n_features}")
    if rows_per_file < 1:
        raise DataError(f"{out}: rows_per_file must be at least 1, got {rows_per_file}")
    # Checked here as well as in the writer so that a long first pass is not wasted.
    if os.path.exists(out) and not overwrite:
        raise DataError(f"{out}: already exists (choose another output folder)")
    writer_options = {"rows_per_file": rows_per_file, "overwrite": overwrite}
    if format == "libsvm":
        _import_libsvm(source, out, n_features, writer_options)
    elif format == "csv":
        _import_csv(source, out, n_features, label, writer_options)
    else:
        _import_numpy(source, out, n_features, label, writer_options)
    return open_dataset(out)


def _check_file(path: str) -> None:
    if not os.path.exists(path):
        raise DataError(f"{path}: file not found")
    if not os.path.isfile(path):
        raise DataError(f"{path}: not a file")


def _writer(out: str, shape: tuple[int, ...], dtype: np.dtype, options: dict[str, Any], **more: Any) -> DatasetWriter:
    """A `DatasetWriter` whose row groups stay within `ROW_GROUP_BYTES`, however wide the rows."""
    row_bytes = math.prod(shape) * np.dtype(dtype).itemsize
    group_rows = max(1, min(ROW_GROUP_ROWS, ROW_GROUP_BYTES // row_bytes))
    return DatasetWriter(out, shape, dtype, row_group_size=group_rows, **options, **more)


def _source_meta(format: str, source: str, **more: Any) -> dict[str, Any]:
    return {"source": {"format": format, "path": os.path.abspath(source), **more}}


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
    meta = _source_meta("libsvm", source)
    with _writer(out, (features,), np.float32, writer_options, extra_meta=meta) as writer:
        for chunk in _libsvm_chunks(source, features, chunk_lines):
            labels = chunk.labels if integer_labels else chunk.labels.astype(np.float64)
            writer.write(chunk.dense(features), labels)


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


# CSV ---------------------------------------------------------------------------------------

_CONVERSION_ERROR = re.compile(r"In CSV column #(\d+): CSV conversion error to \w+: invalid value '(.*)'", re.DOTALL)


def _import_csv(
    source: str, out: str, n_features: int | None, label: str | None, writer_options: dict[str, Any]
) -> None:
    header = _csv_header(source)
    label_position = _label_position(source, header, label)
    feature_positions = [position for position in range(len(header)) if position != label_position]
    feature_names = [header[position] for position in feature_positions]
    if not feature_positions:
        raise DataError(f"{source}: no feature columns besides the label column {header[label_position]!r}")
    if n_features is not None and n_features != len(feature_positions):
        raise DataError(f"{source}: has {len(feature_positions)} feature columns, but n_features={n_features}")
    label_name = header[label_position]
    # Labels are read as text and converted here: Arrow infers a column's type from its first
    # block, and a first pass over the label column settles one type for the whole file.
    label_kind = "int"
    for batch in _csv_batches(source, header, {label_name: pa.string()}, [label_name]):
        label_kind = _wider_kind(label_kind, _label_kind(source, header, label_position, batch.column(0)))
    column_types = {name: pa.float32() for name in feature_names} | {label_name: pa.string()}
    meta = _source_meta("csv", source, label=label_name)
    shape = (len(feature_positions),)
    with _writer(out, shape, np.float32, writer_options, feature_names=feature_names, extra_meta=meta) as writer:
        for batch in _csv_batches(source, header, column_types, None):
            features = np.empty((batch.num_rows, len(feature_positions)), dtype=np.float32)
            for column, position in enumerate(feature_positions):
                features[:, column] = batch.column(position).to_numpy()
            writer.write(features, _convert_labels(batch.column(label_position), label_kind))


def _csv_header(source: str) -> list[str]:
    try:
        with open(source, encoding="utf-8-sig", newline="") as handle:
            header = next(csv.reader(handle), None)
    except UnicodeDecodeError:
        raise DataError(f"{source}:1: the header row is not UTF-8 text") from None
    except (OSError, csv.Error) as error:
        raise DataError(f"{source}:1: cannot read the header row: {error}") from None
    if not header:
        raise DataError(f"{source}:1: expected a header row naming the columns")
    for position, name in enumerate(header):
        if name in header[:position]:
            raise DataError(f"{source}:1: column name {name!r} appears twice in the header")
    return header


def _label_position(source: str, header: list[str], label: str | None) -> int:
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
    shown = ", ".join(header[:20]) + (", ..." if len(header) > 20 else "")
    raise DataError(f"{source}: label column {label!r} not found; the columns are: {shown}")


def _csv_batches(
    source: str, header: list[str], column_types: dict[str, pa.DataType], include: list[str] | None
) -> Iterator[pa.RecordBatch]:
    """Record batches of a few MB each; Arrow errors become `DataError(file:line: what)`."""
    convert = pa_csv.ConvertOptions(
        column_types=column_types,
        include_columns=include,
        # Nothing is a null: an empty or "NA" feature is a bad value, reported with its line.
        null_values=[],
        strings_can_be_null=False,
        quoted_strings_can_be_null=False,
    )
    # A block must hold whole rows: widen it for very wide files, whose rows outgrow a few MB.
    block_size = max(CSV_BLOCK_BYTES, 16 * len(",".join(header)))
    try:
        reader = pa_csv.open_csv(
            source, read_options=pa_csv.ReadOptions(block_size=block_size), convert_options=convert
        )
        if reader.schema.names != (include or header):
            raise DataError(f"{source}:1: the header row reads differently in Arrow: {reader.schema.names}")
        yield from reader
        return
    except pa.ArrowInvalid as error:
        message = str(error)
    except OSError as error:
        raise DataError(f"{source}: cannot read: {error}") from None
    _raise_csv_error(source, header, message)


def _raise_csv_error(source: str, header: list[str], message: str) -> None:
    """Find the line behind Arrow's message (which gives none) with the csv module, and raise."""
    conversion = _CONVERSION_ERROR.search(message)
    if conversion:
        position, value = int(conversion.group(1)), conversion.group(2)
        name = header[position] if position < len(header) else f"#{position}"
        line = _first_csv_line(source, len(header), lambda fields: fields[position] == value)
        what = f"column {name!r} is empty" if value == "" else f"column {name!r} holds {value!r}, which is not a number"
    else:
        line = _first_csv_line(source, len(header), lambda fields: False)
        what = message.removeprefix("CSV parse error: ")
    if isinstance(line, tuple):
        number, count = line
        raise DataError(f"{source}:{number}: has {count} fields, but the header has {len(header)}")
    if line is None:
        raise DataError(f"{source}: {what}")
    raise DataError(f"{source}:{line}: {what}")


def _first_csv_line(source: str, fields: int, is_bad: Callable[[list[str]], bool]) -> int | tuple[int, int] | None:
    """The first data line for which `is_bad` holds, or (line, field count) of a short or long row."""
    with open(source, encoding="utf-8-sig", errors="replace", newline="") as handle:
        reader = csv.reader(handle)
        try:
            next(reader, None)
            for record in reader:
                if not record:
                    continue  # Arrow skips blank lines too
                if len(record) != fields:
                    return reader.line_num, len(record)
                if is_bad(record):
                    return reader.line_num
        except csv.Error:
            return None  # the csv module cannot follow this file either; Arrow's message will do
    return None


_KINDS = ("int", "float", "string")


def _wider_kind(first: str, second: str) -> str:
    return _KINDS[max(_KINDS.index(first), _KINDS.index(second))]


def _label_kind(source: str, header: list[str], position: int, labels: pa.Array) -> str:
    """The narrowest type that holds every label of a batch; an empty label is an error."""
    labels = pc.utf8_trim_whitespace(labels)
    if pc.any(pc.equal(labels, "")).as_py():
        line = _first_csv_line(source, len(header), lambda fields: not fields[position].strip())
        where = f"{source}:{line}" if isinstance(line, int) else source
        raise DataError(f"{where}: the label column {header[position]!r} is empty")
    for kind, arrow_type in (("int", pa.int64()), ("float", pa.float64())):
        try:
            pc.cast(pc.replace_substring_regex(labels, r"^\+", ""), arrow_type)
            return kind
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return "string"


def _convert_labels(labels: pa.Array, kind: str) -> np.ndarray:
    labels = pc.utf8_trim_whitespace(labels)
    if kind == "string":
        return labels.to_numpy(zero_copy_only=False).astype(str)
    arrow_type = pa.int64() if kind == "int" else pa.float64()
    return pc.cast(pc.replace_substring_regex(labels, r"^\+", ""), arrow_type).to_numpy()


# NumPy -------------------------------------------------------------------------------------


def _import_numpy(
    source: str, out: str, n_features: int | None, label: str | None, writer_options: dict[str, Any]
) -> None:
    if zipfile.is_zipfile(source):
        _import_npz(source, out, n_features, writer_options)
        return
    if label is None:
        raise DataError(f"{source}: a features .npy needs its labels: pass the labels .npy as label")
    _check_file(label)
    features = _load_npy(source)
    labels = _load_npy(label)
    sample_shape = _sample_shape(source, features.shape, features.dtype, n_features)
    labels_dtype = _labels_dtype(label, labels.shape, labels.dtype)
    if len(labels) != len(features):
        raise DataError(f"{source} has {len(features)} samples but {label} has {len(labels)} labels")
    rows = _chunk_rows(sample_shape, features.dtype)
    meta = _source_meta("npy", source, labels=os.path.abspath(label))
    with _writer(out, sample_shape, _feature_dtype(features.dtype), writer_options, extra_meta=meta) as writer:
        for start in range(0, len(features), rows):
            labels_chunk = np.asarray(labels[start : start + rows]).reshape(-1).astype(labels_dtype)
            writer.write(np.asarray(features[start : start + rows]), labels_chunk)


def _load_npy(path: str) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise DataError(f"{path}: not a readable NumPy .npy file ({error})") from None


def _sample_shape(source: str, shape: tuple[int, ...], dtype: np.dtype, n_features: int | None) -> tuple[int, ...]:
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


def _feature_dtype(dtype: np.dtype) -> np.dtype:
    """uint8 (images) and float32 are kept; every other number type becomes float32."""
    return dtype if dtype in (np.dtype(np.uint8), np.dtype(np.float32)) else np.dtype(np.float32)


def _labels_dtype(path: str, shape: tuple[int, ...], dtype: np.dtype) -> np.dtype:
    if len(shape) != 1 and not (len(shape) == 2 and shape[1] == 1):
        raise DataError(f"{path}: labels have shape {shape}; expected (n,) or (n, 1)")
    if dtype.kind in "biu":
        return np.dtype(np.int64)
    if dtype.kind == "f":
        return np.dtype(np.float64)
    if dtype.kind in "US":
        return np.dtype(str)
    raise DataError(f"{path}: labels have dtype {dtype}; expected numbers or text")


def _chunk_rows(sample_shape: tuple[int, ...], dtype: np.dtype) -> int:
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
                sample_shape = _sample_shape(f"{source} (x)", features_shape, features_dtype, n_features)
                labels_target = _labels_dtype(f"{source} (y)", labels_shape, labels_dtype)
                if labels_shape[0] != features_shape[0]:
                    raise DataError(f"{source}: x has {features_shape[0]} samples but y has {labels_shape[0]} labels")
                rows = _chunk_rows(sample_shape, features_dtype)
                meta = _source_meta("npz", source)
                dtype = _feature_dtype(features_dtype)
                with _writer(out, sample_shape, dtype, writer_options, extra_meta=meta) as writer:
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
