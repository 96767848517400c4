"""Import of a CSV file with a header row: number columns as features, one label column.

Arrow's streaming CSV reader parses blocks of a few MB, so memory stays flat. A first pass
reads only the label column and the categorical ones, as text: Arrow infers a column's type
from its first block, so the label type for the whole file is settled there, and so are the
categories to one-hot encode (`encoding`). The second pass converts and writes. Arrow's errors
give no line, so on a bad value the csv module finds the line to name.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from shoal.data.encoding import CategoryCollector, Encoding, Locate
from shoal.data.importers.common import (
    ImportRequest,
    TableColumns,
    import_writer,
    offset_locator,
    rows_per_chunk,
    source_meta,
    table_columns,
)
from shoal.errors import DataError

CSV_BLOCK_BYTES = 4 * 1024 * 1024  # the text Arrow parses at a time
_CONVERSION_ERROR = re.compile(r"In CSV column #(\d+): CSV conversion error to \w+: invalid value '(.*)'", re.DOTALL)


def import_file(request: ImportRequest) -> None:
    source, n_features = request.source, request.n_features
    header = _csv_header(source)
    columns = table_columns(request, header)
    if n_features is not None and not columns.categorical and n_features != len(columns.features):
        raise DataError(f"{source}: has {len(columns.features)} feature columns, but n_features={n_features}")
    locate = _csv_locator(source, header)
    label_kind, encoding = _first_pass(request, header, columns, locate)
    if n_features is not None and n_features != encoding.width:
        raise DataError(f"{source}: encodes to {encoding.width} features (categories one-hot), "
                        f"but n_features={n_features}")
    _second_pass(request, header, columns, encoding, label_kind, locate)


def _first_pass(
    request: ImportRequest, header: list[str], columns: TableColumns, locate: Locate
) -> tuple[str, Encoding]:
    """The label type and the encoding, from the label and categorical columns only, read as text.

    Arrow infers a column's type from its first block, so one label type for the whole file is
    settled here, and so are the categories, without loading the file.
    """
    source, encoding, categorical = request.source, request.encoding, columns.categorical
    label_kind, rows = "int", 0
    collector = CategoryCollector(source, categorical)
    # unlabeled and nothing to collect: one column read all the same, to count the rows
    first_pass = [*columns.read_label, *categorical] or header[:1]
    for batch in _csv_batches(source, header, dict.fromkeys(first_pass, pa.string()), first_pass):
        if columns.read_label:
            label_kind = _wider_kind(label_kind, _label_kind(source, header, columns.label_position, batch.column(0)))
        collector.see(batch, offset_locator(locate, rows), encoding)
        rows += batch.num_rows
    if rows == 0:
        raise DataError(f"{source}: no data rows after the header: the source is empty")
    if encoding is None:
        encoding = Encoding(columns.label, tuple(columns.features), collector.categories())
    return label_kind, encoding


def _second_pass(
    request: ImportRequest, header: list[str], columns: TableColumns, encoding: Encoding, label_kind: str,
    locate: Locate,
) -> None:
    """Convert every column and hand the encoded features and the labels to the writer."""
    source = request.source
    labeled = bool(columns.read_label)
    column_types = (dict.fromkeys(columns.features, pa.float32()) | dict.fromkeys(columns.categorical, pa.string())
                    | dict.fromkeys(columns.read_label, pa.string()))
    meta = source_meta("csv", source, label=columns.label) | {"encoding": encoding.to_meta()}
    shape = (encoding.width,)
    # A few bytes of text can encode to many one-hot features: encode a bounded slice at a time.
    slice_rows = rows_per_chunk(shape, np.dtype(np.float32))
    with import_writer(request.out, shape, np.float32, request.writer_options, locate=locate,
                       feature_names=encoding.feature_names, extra_meta=meta, labeled=labeled) as writer:
        rows = 0
        # unlabeled, a reference's label column left in the table is not read
        for batch in _csv_batches(source, header, column_types, None if labeled else list(column_types)):
            for start in range(0, batch.num_rows, slice_rows):
                part = batch.slice(start, slice_rows)
                features = encoding.encode(part, offset_locator(locate, rows))
                labels = _convert_labels(part.column(columns.label), label_kind) if labeled else None
                writer.write(features, labels)
                rows += part.num_rows


def _csv_locator(source: str, header: list[str]) -> Locate:
    """Names data row `row` (0-based; blank lines hold none, as in Arrow) as `file:line`."""

    def locate(row: int) -> str:
        remaining = [row]

        def is_row(fields: list[str]) -> bool:
            remaining[0] -= 1
            return remaining[0] < 0

        line = _first_csv_line(source, len(header), is_row)
        return f"{source}:{line}" if isinstance(line, int) else source

    return locate


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
        what = (f"column {name!r} is empty" if value == "" else f"column {name!r} holds {value!r}, which is not a "
                f"number (if {name!r} is categorical, declare it: --categorical {name})")
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
        if _reads_as(labels, arrow_type):
            return kind
    return "string"


def _without_plus(labels: pa.Array) -> pa.Array:
    """'+1' as '1': LIBSVM-style signs, which Arrow's number casts refuse."""
    return pc.replace_substring_regex(labels, r"^\+", "")


def _reads_as(labels: pa.Array, arrow_type: pa.DataType) -> bool:
    """Whether every label casts to `arrow_type` (Arrow raises at the first one that does not)."""
    try:
        pc.cast(_without_plus(labels), arrow_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def _convert_labels(labels: pa.Array, kind: str) -> np.ndarray:
    labels = pc.utf8_trim_whitespace(labels)
    if kind == "string":
        return labels.to_numpy(zero_copy_only=False).astype(str)
    arrow_type = pa.int64() if kind == "int" else pa.float64()
    return pc.cast(_without_plus(labels), arrow_type).to_numpy()
