"""One-hot encoding of a table's categorical columns on import, kept in meta.json for reuse.

A CSV or Parquet import turns each categorical column into one 0/1 feature per category
(`state=CA`, `state=NY`, ...). Categories are found in a first pass over the source, so the
file is never loaded whole, and sorted, so row order does not change the features. The whole
encoding (label column, feature columns in order, categories of each categorical column) goes
into the dataset's meta.json under `encoding`; importing a test file with `encoding_from=` the
training set gives it the same features in the same order. A category the reference lacks is
an error naming its line or row: mapping it to all zeros would hide a mismatch between files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shoal.data.format import open_dataset
from shoal.errors import DataError

META_KEY = "encoding"
MAX_CATEGORIES = 10_000  # per column: beyond this a one-hot row is too wide to store dense
SHOWN = 20  # names listed in a message before "..."

Locate = Callable[[int], str]  # row of a batch -> "file:line" or "file: row N", for messages


def shown(names: Sequence[str]) -> str:
    return ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")


def text_values(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column's values as trimmed text (numbers as they print), the form categories take."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        values = pc.cast(values, pa.string())
    return pc.utf8_trim_whitespace(values)


def check_filled(name: str, values: pa.Array, locate: Locate) -> None:
    """A categorical value must be there: an empty or null one is an error naming its row."""
    empty = pc.fill_null(pc.equal(values, ""), True)
    if pc.any(empty).as_py():
        row = int(np.flatnonzero(empty.to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{locate(row)}: the categorical column {name!r} is empty")


def resolve_columns(source: str, header: Sequence[str], requested: Sequence[str],
                    label_position: int | None) -> list[str]:
    """Column names for `requested` names or positions (0-based, negative from the end), in header order."""
    positions = set()
    for item in requested:
        if item in header:
            position = header.index(item)
        else:
            try:
                position = int(item)
            except ValueError:
                position = None
            if position is None or not -len(header) <= position < len(header):
                raise DataError(f"{source}: categorical column {item!r} not found; the columns are: {shown(header)}")
            position %= len(header)
        if position == label_position:
            name = header[position]
            raise DataError(f"{source}: column {name!r} is the label; it cannot also be a categorical feature")
        positions.add(position)
    return [header[position] for position in sorted(positions)]


class CategoryCollector:
    """The first pass: the distinct values of each categorical column, batch by batch."""

    def __init__(self, source: str, columns: Sequence[str]):
        self.source = source
        self.values: dict[str, set[str]] = {name: set() for name in columns}

    def add(self, name: str, values: pa.Array | pa.ChunkedArray, locate: Locate) -> None:
        values = text_values(values)
        check_filled(name, values, locate)
        seen = self.values[name]
        seen.update(pc.unique(values).to_pylist())
        if len(seen) > MAX_CATEGORIES:
            raise DataError(f"{self.source}: the categorical column {name!r} has more than {MAX_CATEGORIES:,} "
                            "distinct values; is it really categorical?")

    def see(self, batch: pa.RecordBatch, locate: Locate, reference: Encoding | None) -> None:
        """A batch's categorical columns: collected, or checked against a reference encoding when reused."""
        for name in self.values:
            if reference is None:
                self.add(name, batch.column(name), locate)
            else:
                reference.check_known(name, batch.column(name), locate)

    def categories(self) -> dict[str, tuple[str, ...]]:
        return {name: tuple(sorted(values)) for name, values in self.values.items()}


@dataclass(frozen=True)
class Encoding:
    """How a table's columns become features: source columns in order, categories of the categorical ones."""

    label: str | None
    """The label column's name (None: imported unlabeled, rows to predict)."""
    columns: tuple[str, ...]
    """The feature columns, in the order their features appear."""
    categories: dict[str, tuple[str, ...]]
    """Each categorical column's categories, in the order of their one-hot features."""
    origin: str | None = None
    """The dataset folder this encoding was read from, for messages."""
    _value_sets: dict[str, pa.Array] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name, categories in self.categories.items():
            self._value_sets[name] = pa.array(categories, type=pa.string())

    @property
    def feature_names(self) -> list[str]:
        names: list[str] = []
        for name in self.columns:
            if name in self.categories:
                names.extend(f"{name}={category}" for category in self.categories[name])
            else:
                names.append(name)
        return names

    @property
    def width(self) -> int:
        return sum(len(self.categories.get(name, (None,))) for name in self.columns)

    def to_meta(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "columns": list(self.columns),
            "categories": {name: list(categories) for name, categories in self.categories.items()},
        }

    @classmethod
    def from_dataset(cls, path: str) -> Encoding:
        """The encoding a dataset folder was imported with; an error if it has none."""
        meta = open_dataset(path).meta.get(META_KEY)
        where = f"{path}/meta.json"
        if meta is None:
            raise DataError(f"{where}: has no '{META_KEY}' (only CSV and Parquet imports record one)")
        try:
            label, columns, categories = meta["label"], meta["columns"], meta["categories"]
            ok = (isinstance(label, str | None) and isinstance(columns, list) and isinstance(categories, dict)
                  and all(isinstance(name, str) for name in columns)
                  and all(name in columns and all(isinstance(value, str) for value in values)
                          for name, values in categories.items()))
        except (KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            raise DataError(f"{where}: '{META_KEY}' is malformed (expected label, columns and categories)")
        return cls(label, tuple(columns), {name: tuple(values) for name, values in categories.items()}, str(path))

    def check_columns(self, source: str, names: Sequence[str]) -> None:
        """The source must have the reference's feature columns, no more and no fewer (in any order)."""
        missing = [name for name in self.columns if name not in names]
        extra = [name for name in names if name not in self.columns]
        if missing:
            raise DataError(f"{source}: lacks the feature column(s) {shown(missing)} of the encoding of {self.origin}")
        if extra:
            raise DataError(f"{source}: has feature column(s) {shown(extra)} that the encoding of {self.origin} lacks")

    def check_known(self, name: str, values: pa.Array | pa.ChunkedArray, locate: Locate) -> pa.Array:
        """Indices of `values` among the column's categories; an unknown category is an error naming its row."""
        values = text_values(values)
        check_filled(name, values, locate)
        index = pc.index_in(values, value_set=self._value_sets[name])
        if index.null_count:
            row = int(np.flatnonzero(index.is_null().to_numpy(zero_copy_only=False))[0])
            known = shown(self.categories[name])
            raise DataError(f"{locate(row)}: column {name!r} holds {values[row].as_py()!r}, a category the encoding "
                            f"of {self.origin or 'this import'} does not have (it has: {known})")
        return index

    def encode(self, batch: pa.RecordBatch, locate: Locate) -> np.ndarray:
        """The float32 features (rows, width) of a batch holding every feature column by name."""
        features = np.zeros((batch.num_rows, self.width), dtype=np.float32)
        offset = 0
        for name in self.columns:
            values = batch.column(name)
            if name in self.categories:
                index = self.check_known(name, values, locate).to_numpy(zero_copy_only=False)
                features[np.arange(batch.num_rows), offset + index] = 1
                offset += len(self.categories[name])
            else:
                features[:, offset] = values.to_numpy(zero_copy_only=False)
                offset += 1
        return features
