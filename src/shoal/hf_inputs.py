"""A Hugging Face `datasets.Dataset` as fit's `train` or `test`: its columns read as a DataFrame's are.

A Dataset is an Arrow table, often memory-mapped from a cache larger than memory, so it is read a
chunk of rows at a time, in its own row order (a `select`ed, shuffled or split Dataset keeps an index
mapping over its table, which reading the table itself would ignore) and with the columns its format
shows. The `label` column (fit's `label` names another) holds the labels; the other columns are the
features. Number columns become a row of features, through the Parquet importer as a DataFrame's do;
a single column of fixed-shape arrays (nested lists, `Array2D`, or images, decoded) gives each sample
its shape. A transform set on the Dataset would be drawn once for every epoch, so it is refused.
`datasets` itself is never imported: the objects are recognised by their module's name.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shoal.data.format import Dataset, open_dataset
from shoal.data.importers.common import rows_per_chunk
from shoal.data.in_memory import RANDOM_ADVICE, write_chunks
from shoal.errors import ConfigError, DataError

LABEL_COLUMN = "label"  # the label column when fit's `label` names none, as Hugging Face names it
KINDS = ("datasets.arrow_dataset.Dataset", "datasets.dataset_dict.DatasetDict",
         "datasets.dataset_dict.IterableDatasetDict", "datasets.iterable_dataset.IterableDataset")
"""The `datasets` classes, by module and name: a user's own class called Dataset is not one of them."""


def hugging_face_kind(data: Any) -> str | None:
    """Dataset, DatasetDict, IterableDatasetDict or IterableDataset (or a subclass of one); None for others."""
    for kind in type(data).__mro__:
        if f"{kind.__module__}.{kind.__qualname__}" in KINDS:
            return kind.__name__
    return None


def is_hugging_face(data: Any) -> bool:
    return hugging_face_kind(data) is not None


def write_hugging_face(data: Any, out: str, where: str, *, label: str | None = None,
                       encoding_from: str | None = None) -> Dataset | None:
    """Write a `datasets.Dataset` as a dataset folder at `out`; None for an IterableDataset, which is read as
    any iterable of dict items is. `where` names it in errors."""
    kind = hugging_face_kind(data)
    if kind in ("DatasetDict", "IterableDatasetDict"):
        split = where if where in data else next(iter(data), where)
        raise ConfigError(f"{where}: a {kind} of splits ({', '.join(map(repr, data))}), not one: give one split, "
                          f"{where}=dataset[{split!r}]")
    if kind != "Dataset":
        return None
    if (data.format.get("type") or "") == "custom":
        raise ConfigError(f"{where}: the Dataset has a transform (set_transform or with_transform): "
                          f"{RANDOM_ADVICE}, or apply a fixed one with dataset.map")
    label = label or LABEL_COLUMN
    shown = None if data.format.get("output_all_columns") else data.format.get("columns")
    columns = list(shown or data.column_names)
    if label not in columns:
        raise ConfigError(f"label: {where} has no column {label!r}; its columns are {', '.join(map(repr, columns))} "
                          "(fit's label= names the label column)")
    features = [name for name in columns if name != label]
    if not features:
        raise ConfigError(f"{where}: holds only the label column {label!r}: no feature columns to learn from")
    if len(data) == 0:
        raise ConfigError(f"{where}: holds no samples")
    _check_label_type(data, label, where)
    kinds = {name: _column_kind(data, name, where) for name in features}
    arrays = [name for name, column in kinds.items() if column != "number"]
    if not arrays:
        return _write_numbers(data, [*features, label], out, where, label, encoding_from)
    if len(features) == 1:
        return _write_arrays(data, features[0], kinds[features[0]] == "image", label, out, where, encoding_from)
    raise ConfigError(f"{where}: column {arrays[0]!r} holds arrays beside the columns {_shown(features, arrays[0])}: "
                      f"give number columns, or one column of arrays (dataset.select_columns([{arrays[0]!r}, "
                      f"{label!r}]))")


def _shown(names: list[str], leaving: str) -> str:
    return ", ".join(repr(name) for name in names if name != leaving)


def _arrow_type(data: Any, name: str) -> pa.DataType:
    kind = data.data.schema.field(name).type
    return kind.storage_type if isinstance(kind, pa.ExtensionType) else kind


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _is_text(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _column_kind(data: Any, name: str, where: str) -> str:
    """number, array or image for a feature column; anything else is refused, as a DataFrame's text is."""
    if type(data.features[name]).__name__ == "Image":
        return "image"
    kind = _arrow_type(data, name)
    if _is_number(kind) or pa.types.is_decimal(kind):
        return "number"
    if _is_list(kind):
        return "array"
    what = f"text ({kind})" if _is_text(kind) else f"{data.features[name]}"
    raise ConfigError(f"{where}: column {name!r} holds {what}, not numbers: encode it as numbers before fit "
                      f"(dataset.map), or drop it (dataset.remove_columns([{name!r}]))")


def _check_label_type(data: Any, label: str, where: str) -> None:
    kind = _arrow_type(data, label)
    if not (_is_number(kind) or _is_text(kind) or pa.types.is_decimal(kind)):
        raise ConfigError(f"{where}: the label column {label!r} holds {data.features[label]}; expected one number "
                          "or text per row")


def _write_numbers(data: Any, columns: list[str], out: str, where: str, label: str,
                   encoding_from: str | None) -> Dataset:
    """Number columns through the Parquet importer, as a DataFrame's are, a chunk of rows at a time."""
    from shoal.data.importers import import_dataset

    if encoding_from is not None and "encoding" not in open_dataset(encoding_from).meta:
        raise ConfigError(f"{where}: holds number columns, but the train data's samples have shape "
                          f"{tuple(open_dataset(encoding_from).shape)}: give both as the same kind of columns")
    handle, staged = tempfile.mkstemp(suffix=".parquet", prefix="shoal-dataset-")
    os.close(handle)
    try:
        _stage(data.select_columns(columns).with_format("arrow"), columns, staged, where)
        try:
            return import_dataset(staged, out, "parquet", label=label, encoding_from=encoding_from)
        except DataError as error:  # the staged file and the dataset folder are shoal's, not the user's
            message = str(error).replace(staged, "the Dataset").replace(f"{os.path.abspath(out)}: ", "")
            raise DataError(f"{where}: {message.replace(f'{out}: ', '')}") from None
    finally:
        os.remove(staged)


def _stage(rows: Any, columns: list[str], staged: str, where: str) -> None:
    """The rows as a Parquet file for the importer; a missing or non-finite value is named by its row here,
    where the row's index is the Dataset's."""
    step = rows_per_chunk((len(columns),), np.dtype(np.float64))
    writer = None
    try:
        for start in range(0, len(rows), step):
            table = rows[start : start + step].replace_schema_metadata(None)
            for name in columns:
                _check_filled(table.column(name).combine_chunks(), start, 1, name, where)
                _check_finite(table.column(name).combine_chunks(), start, name, where)
            writer = writer or pq.ParquetWriter(staged, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


def _at(row: int, name: str) -> str:
    return f"row {row + 1} (index {row}) of column {name!r}"


def _check_filled(values: pa.Array, start: int, per_row: int, name: str, where: str) -> None:
    """A null is a value missing, which no number stands for: refused, naming its row."""
    if values.null_count:
        row = start + int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0]) // per_row
        raise DataError(f"{where}: {_at(row, name)} is empty (null): fill or drop it before fit")


def _check_finite(values: pa.Array, start: int, name: str, where: str) -> None:
    if pa.types.is_floating(values.type):
        finite = pc.is_finite(values).to_numpy(zero_copy_only=False)
        if not finite.all():
            row = int(np.flatnonzero(~finite)[0])
            raise DataError(f"{where}: {_at(start + row, name)} holds a non-finite value "
                            f"({values[row].as_py()}): fix or drop it before fit")


def _write_arrays(data: Any, name: str, image: bool, label: str, out: str, where: str,
                  encoding_from: str | None) -> Dataset:
    """One column of arrays: each sample keeps its shape; a test set's must be its training set's."""
    chunks = _array_chunks(data, name, image, label, where)
    first = next(chunks)
    if encoding_from is not None:
        shape = tuple(open_dataset(encoding_from).shape)
        if first[1].shape[1:] != shape:
            raise ConfigError(f"{where}: column {name!r} holds arrays of shape {first[1].shape[1:]}, but the train "
                              f"data's samples have shape {shape}")
    try:
        return write_chunks(_chained(first, chunks), out, where, encoding_from)
    except DataError as error:  # the writer names `where` before a message that these chunks' errors begin with
        raise DataError(str(error).replace(f"{where}: {where}: ", f"{where}: ", 1)) from None


def _chained(first: Any, rest: Iterator) -> Iterator:
    yield first
    yield from rest


def _array_chunks(data: Any, name: str, image: bool, label: str,
                  where: str) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(first row, features, labels) chunks; the first is one row, whose size sets the others'."""
    rows = data.select_columns([name, label]).with_format("arrow")
    pictures = data.select_columns([name]).with_format("numpy") if image else None
    start, step, shape = 0, 1, None
    while start < len(rows):
        table = rows[start : start + step]
        features = (_pictures(pictures[start : start + step][name], start, name, where, shape) if image
                    else _nested(table.column(name).combine_chunks(), start, name, where))
        shape = shape or features.shape[1:]
        if features.shape[1:] != shape:
            raise ConfigError(f"{where}: {_at(start, name)} has shape {features.shape[1:]}; row 1's has {shape}: "
                              "give every row's array the same shape")
        features = _channels_first(features) if image else features
        labels = table.column(label).combine_chunks()
        _check_filled(labels, start, 1, label, where)
        yield start, features, _labels(labels)
        start, step = start + len(features), rows_per_chunk(shape, np.dtype(np.float32))


def _nested(values: pa.Array, start: int, name: str, where: str) -> np.ndarray:
    """Nested lists of numbers as one array; lists of uneven length, or a missing value, named by row."""
    if isinstance(values.type, pa.ExtensionType):
        values = values.storage
    shape = [len(values)]
    while _is_list(values.type):
        per_row = math.prod(shape[1:])
        _check_filled(values, start, per_row, name, where)
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
        uneven = np.flatnonzero(lengths != lengths[0])
        if len(uneven):
            raise ConfigError(f"{where}: {_at(start + int(uneven[0]) // per_row, name)} holds a list of "
                              f"{lengths[uneven[0]]} values where row 1's holds {lengths[0]}: give every row's "
                              "array the same shape")
        shape.append(int(lengths[0]))
        values = values.flatten()
    if not _is_number(values.type):
        raise ConfigError(f"{where}: column {name!r} holds arrays of {values.type}, not numbers")
    _check_filled(values, start, math.prod(shape[1:]), name, where)
    if 0 in shape[1:]:
        raise ConfigError(f"{where}: {_at(start, name)} holds an empty array (shape {tuple(shape[1:])})")
    return values.to_numpy(zero_copy_only=False).reshape(shape)


def _pictures(images: Any, start: int, name: str, where: str, shape: tuple | None) -> np.ndarray:
    """Decoded images (the Dataset's own decoding): an array when they share row 1's `shape`, else the first
    unlike it named (in the first chunk, row 1 is the first image)."""
    if isinstance(images, np.ndarray) and images.dtype != object:
        return images
    first = shape or np.shape(images[0])
    for offset, image in enumerate(images):
        if image is None:
            raise DataError(f"{where}: {_at(start + offset, name)} is empty (null): fill or drop it before fit")
        if np.shape(image) != first:
            raise ConfigError(f"{where}: {_at(start + offset, name)} is an image of shape {np.shape(image)}; "
                              f"row 1's is {first}: give every image the same size and mode")
    return np.stack(images)


def _channels_first(images: np.ndarray) -> np.ndarray:
    """Decoded images ([N, H, W] grey, [N, H, W, C] colour) as [N, C, H, W], as `shoal data import --format images`
    stores them, so one conv2d model takes either."""
    return images[:, None] if images.ndim == 3 else np.ascontiguousarray(images.transpose(0, 3, 1, 2))


def _labels(values: pa.Array) -> np.ndarray:
    """One label per row, as the Parquet importer reads a label column: text stripped, numbers widened."""
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if _is_text(values.type):
        return np.char.strip(values.to_numpy(zero_copy_only=False).astype(str))
    if pa.types.is_decimal(values.type):
        values = pc.cast(values, pa.float64())
    numbers = values.to_numpy(zero_copy_only=False)
    return numbers.astype(np.float64 if numbers.dtype.kind == "f" else np.int64)
