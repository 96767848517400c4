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

from shoal.data import importers
from shoal.data.encoding import CategoryCollector, Encoding, Locate, resolve_columns
from shoal.errors import DataError

BATCH_ROWS = 65_536  # rows per batch of the first pass, which reads only label and categories


def import_parquet(
    source: str,
    out: str,
    n_features: int | None,
    label: str | None,
    categorical: list[str],
    encoding: Encoding | None,
    writer_options: dict[str, Any],
) -> None:
    parquet = _open(source)
    schema = parquet.schema_arrow
    names = schema.names
    for position, name in enumerate(names):
        if name in names[:position]:
            raise DataError(f"{source}: column name {name!r} appears twice")
    if label is None and encoding is not None and encoding.label in names:
        label = encoding.label
    label_position = importers.label_column(source, names, label)
    label_name = names[label_position]
    feature_names = [name for position, name in enumerate(names) if position != label_position]
    if not feature_names:
        raise DataError(f"{source}: no feature columns besides the label column {label_name!r}")
    if encoding is not None:
        encoding.check_columns(source, feature_names)
        categorical = list(encoding.categories)
    else:
        categorical = resolve_columns(source, names, categorical, label_position)
    for name in feature_names:
        _check_feature_type(source, name, schema.field(name).type, name in categorical)
    label_target = _label_dtype(source, label_name, schema.field(label_name).type)
    if parquet.metadata.num_rows == 0:
        raise DataError(f"{source}: holds no rows: the source is empty")
    locate = importers.row_locator(source)

    # First pass: null labels, and the categories (or, with a reference encoding, unknown ones).
    collector = CategoryCollector(source, categorical)
    rows = 0
    for batch in _batches(source, parquet, [label_name, *categorical], BATCH_ROWS):
        _check_filled(label_name, batch.column(label_name), locate, rows)
        for name in categorical:
            at = importers.offset_locator(locate, rows)
            if encoding is None:
                collector.add(name, batch.column(name), at)
            else:
                encoding.check_known(name, batch.column(name), at)
        rows += batch.num_rows
    if encoding is None:
        encoding = Encoding(label_name, tuple(feature_names), collector.categories())
    if n_features is not None and n_features != encoding.width:
        raise DataError(f"{source}: encodes to {encoding.width} features, but n_features={n_features}")

    meta = importers.source_meta("parquet", source, label=label_name) | {"encoding": encoding.to_meta()}
    batch_rows = max(1, min(BATCH_ROWS, importers.CHUNK_BYTES // (4 * encoding.width)))
    with importers.import_writer(out, (encoding.width,), np.float32, writer_options, locate=locate,
                                 feature_names=encoding.feature_names, extra_meta=meta) as writer:
        rows = 0
        for batch in _batches(source, parquet, [*feature_names, label_name], batch_rows):
            columns = []
            for name in feature_names:
                values = batch.column(name)
                if name not in categorical:
                    _check_filled(name, values, locate, rows)
                    values = pc.cast(values, pa.float32(), safe=False)
                columns.append(values)
            table = pa.RecordBatch.from_arrays(columns, feature_names)
            features = encoding.encode(table, importers.offset_locator(locate, rows))
            writer.write(features, _labels(batch.column(label_name), label_target))
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
