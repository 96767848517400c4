"""Import of a generic Parquet table (not a shoal dataset): number columns as features, one label column.

Columns are typed, so there is nothing to guess: number and boolean columns become float32
features, a text column must be declared categorical and is one-hot encoded as in a CSV import
(`encoding`), anything else is an error naming the column. The label column defaults to the
last. The file is read in record batches (`ParquetFile.iter_batches`), twice when there are
categories to find, so memory stays flat however many row groups it has.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shoal.data.encoding import CategoryCollector, Encoding, Locate
from shoal.data.importers.common import (
    ImportRequest,
    TableColumns,
    import_writer,
    offset_locator,
    row_locator,
    rows_per_chunk,
    source_meta,
    table_columns,
)
from shoal.errors import DataError

BATCH_ROWS = 65_536  # rows per batch of the first pass, which reads only label and categories


def import_file(request: ImportRequest) -> None:
    source = request.source
    parquet = _open(source)
    schema = parquet.schema_arrow
    names = schema.names
    for position, name in enumerate(names):
        if name in names[:position]:
            raise DataError(f"{source}: column name {name!r} appears twice")
    columns = table_columns(request, names)
    for name in columns.features:
        _check_feature_type(source, name, schema.field(name).type, name in columns.categorical)
    label_target = None if columns.label is None else _label_dtype(source, columns.label,
                                                                    schema.field(columns.label).type)
    if parquet.metadata.num_rows == 0:
        raise DataError(f"{source}: holds no rows: the source is empty")
    locate = row_locator(source)
    encoding = _first_pass(request, parquet, columns, locate)
    if request.n_features is not None and request.n_features != encoding.width:
        raise DataError(f"{source}: encodes to {encoding.width} features, but n_features={request.n_features}")
    _second_pass(request, parquet, columns, encoding, label_target, locate)


def _first_pass(request: ImportRequest, parquet: pq.ParquetFile, columns: TableColumns, locate: Locate) -> Encoding:
    """Null labels, and the categories (or, with a reference encoding, unknown ones): the encoding to write."""
    source, encoding, categorical = request.source, request.encoding, columns.categorical
    collector = CategoryCollector(source, categorical)
    rows = 0
    for batch in _batches(source, parquet, [*columns.read_label, *categorical], BATCH_ROWS):
        if columns.read_label:
            _check_filled(columns.label, batch.column(columns.label), locate, rows)
        collector.see(batch, offset_locator(locate, rows), encoding)
        rows += batch.num_rows
    if encoding is None:
        encoding = Encoding(columns.label, tuple(columns.features), collector.categories())
    return encoding


def _second_pass(
    request: ImportRequest,
    parquet: pq.ParquetFile,
    columns: TableColumns,
    encoding: Encoding,
    label_target: np.dtype | None,
    locate: Locate,
) -> None:
    """Encode the features and hand them, with the labels, to the writer a batch at a time."""
    source, feature_names = request.source, columns.features
    meta = source_meta("parquet", source, label=columns.label) | {"encoding": encoding.to_meta()}
    batch_rows = min(BATCH_ROWS, rows_per_chunk((encoding.width,), np.dtype(np.float32)))
    label = columns.read_label
    with import_writer(request.out, (encoding.width,), np.float32, request.writer_options, locate=locate,
                       feature_names=encoding.feature_names, extra_meta=meta, labeled=bool(label)) as writer:
        rows = 0
        for batch in _batches(source, parquet, [*feature_names, *label], batch_rows):
            arrays = []
            for name in feature_names:
                values = batch.column(name)
                if name not in columns.categorical:
                    _check_filled(name, values, locate, rows)
                    values = pc.cast(values, pa.float32(), safe=False)
                arrays.append(values)
            table = pa.RecordBatch.from_arrays(arrays, feature_names)
            features = encoding.encode(table, offset_locator(locate, rows))
            writer.write(features, _labels(batch.column(columns.label), label_target) if label else None)
            rows += batch.num_rows


def _open(source: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(source)
    except (pa.ArrowException, OSError) as error:
        raise DataError(f"{source}: not a readable Parquet file ({error})") from None


def _batches(source: str, parquet: pq.ParquetFile, columns: list[str], rows: int) -> Any:
    try:
        yield from parquet.iter_batches(batch_size=rows, columns=columns, use_threads=False)
    except (pa.ArrowException, OSError) as error:
        raise DataError(f"{source}: cannot read: {error}") from None


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind) \
        or pa.types.is_decimal(kind)


def _is_text(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _check_feature_type(source: str, name: str, kind: pa.DataType, categorical: bool) -> None:
    """Numbers are features; text must be declared categorical; a categorical column may hold numbers too."""
    if _is_number(kind) or (categorical and _is_text(kind)):
        return
    if _is_text(kind):
        raise DataError(f"{source}: column {name!r} holds text ({kind}), not numbers "
                        f"(if {name!r} is categorical, declare it: --categorical {name})")
    raise DataError(f"{source}: column {name!r} has type {kind}, which is neither numbers nor text")


def _label_dtype(source: str, name: str, kind: pa.DataType) -> np.dtype:
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return np.dtype(np.int64)
    if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return np.dtype(np.float64)
    if _is_text(kind):
        return np.dtype(str)
    raise DataError(f"{source}: the label column {name!r} has type {kind}; expected numbers or text")


def _check_filled(name: str, values: pa.Array, locate: Locate, first_row: int) -> None:
    if values.null_count:
        row = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{locate(first_row + row)}: column {name!r} is empty (null)")


def _labels(values: pa.Array, target: np.dtype) -> np.ndarray:
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if target.kind == "U":
        return np.char.strip(values.to_numpy(zero_copy_only=False).astype(str))
    if pa.types.is_decimal(values.type):
        values = pc.cast(values, pa.float64())
    return values.to_numpy(zero_copy_only=False).astype(target)
