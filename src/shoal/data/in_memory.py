"""Datasets from what a Python user already holds: arrays or tensors, a pandas DataFrame, a torch Dataset
(map-style or iterable) of (features, label) pairs or of dicts.

Workers read a dataset folder, each its own share; data held in a notebook's memory is first
written to one, a chunk at a time, by the same writer and checks as the importers. A DataFrame
goes through the Parquet importer, so its text and categorical columns are encoded as a file's
would be, and a test frame takes the training frame's encoding.

Items that are dicts (as Accelerate and Lightning code holds them) keep their names: every entry
but the label is a field, flattened into the row in the first item's key order, and meta.json
records the layout (`fields`, `label_key`), from which the loader gives dict batches back.

The data is written once and every epoch reads it again, so a random transform drawn inside it
would be drawn once for all epochs. A map-style Dataset is read twice at a few items first, and one
that differs is refused; an iterable cannot be read twice, so it is streamed once with a warning.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shoal.data.format import Dataset, DatasetWriter, first_non_finite, open_dataset
from shoal.data.importers.common import stored_dtype
from shoal.data.meta import FIELD_DTYPES
from shoal.errors import ConfigError, DataError

CHUNK_ROWS = 8192  # rows of a torch Dataset or iterable gathered before each write
LABEL_KEY = "label"  # the label's key in dict items when fit's `label` names none
KIND_WORDS = {"b": "booleans", "i": "integers", "f": "floats"}
RANDOM_ADVICE = ("shoal writes a Dataset once, so one draw would serve every epoch; apply the random part as "
                 "shoal.fit(transform=...), run on every batch every epoch")


def write_in_memory(data: Any, out: str, where: str, *, label: str | None = None,
                    encoding_from: str | None = None) -> Dataset:
    """Write `data` ((features, labels), a DataFrame with its `label` column, a map-style torch Dataset or an
    iterable of (features, label) items or of dicts holding the `label` key) as a dataset folder at `out`;
    `where` names it in errors."""
    if _is_frame(data):
        return _write_frame(data, out, where, label, encoding_from)
    if isinstance(data, (tuple, list)) and not (data and isinstance(data[0], Mapping)):
        if label is not None:
            raise ConfigError(f"label: names a DataFrame's column or the label's key in dict items; {where} is a "
                              f"{type(data).__name__} of arrays")
        if len(data) != 2:
            raise ConfigError(f"{where}: expected (features, labels), got a sequence of {len(data)}")
        return _write_arrays(_numpy(data[0], where), _numpy(data[1], where), out, where, encoding_from)
    if type(data).__name__ == "DataLoader" and hasattr(data, "dataset"):
        raise ConfigError(f"{where}: a DataLoader yields batches, not items: give its dataset ({where}=loader.dataset)"
                          "; shoal makes the batches itself (batch_size)")
    if _is_map_style(data):
        return _write_map_style(data, out, where, label, encoding_from)
    if hasattr(data, "__iter__"):
        return _write_iterable(data, out, where, label, encoding_from)
    raise ConfigError(f"{where}: expected a dataset folder, (features, labels) arrays, a pandas DataFrame, "
                      f"a torch Dataset or an iterable of items, got {type(data).__name__}")


def _is_frame(data: Any) -> bool:
    return type(data).__name__ == "DataFrame" and hasattr(data, "columns")


def _is_map_style(data: Any) -> bool:
    """Items by index; a torch (or Hugging Face) IterableDataset is read by iterating, even with a length."""
    iterable = any(kind.__name__ == "IterableDataset" for kind in type(data).__mro__)
    return hasattr(data, "__getitem__") and hasattr(data, "__len__") and not iterable


def _numpy(value: Any, where: str) -> np.ndarray:
    if hasattr(value, "detach"):  # a tensor, wherever it lives
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype.kind not in "biufUSO":
        raise ConfigError(f"{where}: holds {array.dtype} values; expected numbers")
    return array


def _write_arrays(features: np.ndarray, labels: np.ndarray, out: str, where: str,
                  classes_from: str | None) -> Dataset:
    if features.ndim == 0 or len(features) == 0:
        raise ConfigError(f"{where}: holds no samples")
    labels = labels.reshape(len(labels), -1)
    if labels.shape[1] != 1:
        raise ConfigError(f"{where}: labels have shape {labels.shape}; expected one label per row")
    if len(labels) != len(features):
        raise ConfigError(f"{where}: {len(features)} rows of features but {len(labels)} labels")
    chunks = ((start, features[start : start + CHUNK_ROWS], labels[start : start + CHUNK_ROWS, 0])
              for start in range(0, len(features), CHUNK_ROWS))
    return write_chunks(chunks, out, where, classes_from)


def _write_map_style(data: Any, out: str, where: str, label: str | None, classes_from: str | None) -> Dataset:
    """A map-style Dataset, CHUNK_ROWS items at a time: memory holds a chunk, not the set."""
    if len(data) == 0:
        raise ConfigError(f"{where}: holds no samples")
    _check_repeatable(data, where)
    items = ((index, data[index]) for index in range(len(data)))
    return _write_items(items, out, where, label, classes_from)


def _write_iterable(data: Any, out: str, where: str, label: str | None, classes_from: str | None) -> Dataset:
    """An iterable, streamed once, CHUNK_ROWS items at a time; what it draws at random is drawn once."""
    items = enumerate(iter(data))
    first = next(items, None)
    if first is None:
        raise ConfigError(f"{where}: the iterable ({type(data).__name__}) yields no items")
    dataset = _write_items(itertools.chain([first], items), out, where, label, classes_from)
    warnings.warn(f"{where}: an iterable dataset is read once, into a dataset every epoch reads again "
                  f"({dataset.rows:,} rows): a random transform in it is drawn once; give it as "
                  "shoal.fit(transform=...) to apply it every epoch", stacklevel=3)
    return dataset


def _write_items(items: Iterator[tuple[int, Any]], out: str, where: str, label: str | None,
                 classes_from: str | None) -> Dataset:
    """(index, item) pairs into a dataset: the first item says whether they are pairs or dicts."""
    first = next(items)
    layout = (Fields.of(first[1], label or LABEL_KEY, where) if isinstance(first[1], Mapping)
              else Pairs.of(first[1], label, where))
    return write_chunks(_chunks(itertools.chain([first], items), layout, where), out, where, classes_from,
                         layout.meta())


def _chunks(items: Iterator[tuple[int, Any]], layout: Pairs | Fields,
            where: str) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(first row, features, labels) of CHUNK_ROWS items at a time."""
    while taken := list(itertools.islice(items, CHUNK_ROWS)):
        rows = [layout.row(item, f"{where}: row {index + 1} (index {index})")  # counted from 1, as NaN rows are
                for index, item in taken]
        start = taken[0][0]
        yield start, *layout.stack(rows, start, where)


def write_chunks(chunks, out: str, where: str, classes_from: str | None, meta: dict | None = None) -> Dataset:
    """(first row, features, labels) chunks into a dataset shaped like the first; a failure leaves no folder.

    Each chunk is checked before it is written, so that a bad row is named by its place in the user's
    data, not in a folder the user never made. A test set takes its training set's classes
    (`classes_from`): it may hold fewer of them, not others. `meta`: more keys for meta.json."""
    start, features, labels = next(chunks)
    if features.dtype.kind not in "biuf":
        raise ConfigError(f"{where}: features have dtype {features.dtype}; expected numbers")
    classes = open_dataset(classes_from).classes if classes_from else None
    try:
        with DatasetWriter(out, features.shape[1:] or (1,), stored_dtype(features.dtype),
                           classes=classes, extra_meta=meta) as writer:
            while True:
                _check_rows(start, features, labels, classes)
                writer.write(features, labels)
                start, features, labels = next(chunks, (None, None, None))
                if start is None:
                    break
    except DataError as error:
        message = str(error).replace(f"{os.path.abspath(out)}: ", "")
        raise DataError(f"{where}: {message}") from None
    return open_dataset(out)


def _check_rows(start: int, features: np.ndarray, labels: np.ndarray, classes: list | None) -> None:
    """NaN or infinity in a chunk, or a label outside the training set's classes: the row, counted from 1
    (the caller adds which argument)."""
    for values, what in ((features, "features"), (labels, "labels")):
        bad = first_non_finite(values)
        if bad is not None:
            row = start + bad[0]
            raise DataError(f"row {row + 1} (index {row}) of the {what} holds a non-finite value "
                            f"({bad[1]}): fix or drop it before fit")
    if classes is not None:
        unknown = ~np.isin(labels, np.asarray(classes))
        if unknown.any():
            row = start + int(np.flatnonzero(unknown)[0])
            value = labels[row - start]
            raise DataError(f"row {row + 1} (index {row}) has label {value.item()!r}, which is not one "
                            f"of the training labels {classes}")


def _label(value: Any, where: str) -> np.ndarray:
    """One label per item: a dataset stores one value per row, and cutting the rest would train on less."""
    label = _numpy(value, where).reshape(-1)
    if label.size != 1:
        raise ConfigError(f"{where}: label has {label.size} elements, shape {tuple(np.shape(value))}; "
                          f"expected one value (a class or a number)")
    return label


@dataclass
class Pairs:
    """(features, label) items: the features as they are shaped, one label each."""

    @classmethod
    def of(cls, first: Any, label: str | None, where: str) -> Pairs:
        if label is not None:
            raise ConfigError(f"label: names a DataFrame's column or the label's key in dict items; {where}'s "
                              f"items are {type(first).__name__}s, not dicts")
        return cls()

    def meta(self) -> dict:
        return {}

    def row(self, item: Any, at: str) -> tuple[np.ndarray, np.ndarray]:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ConfigError(f"{at} is not a (features, label) pair")
        return _numpy(item[0], at), _label(item[1], at)

    def stack(self, rows: list, start: int, where: str) -> tuple[np.ndarray, np.ndarray]:
        try:
            return np.stack([features for features, _ in rows]), np.concatenate([label for _, label in rows])
        except ValueError as error:
            stop = start + len(rows)
            raise ConfigError(f"{where}: rows {start + 1} to {stop} (indices {start} to {stop - 1}) differ in "
                              f"shape: {error}") from None


@dataclass
class Field:
    """One entry of dict items: its name, shape, kind of values (b, i or f) and columns in the row."""

    name: str
    shape: tuple[int, ...]
    kind: str
    start: int
    stop: int


def _kind(dtype: np.dtype) -> str | None:
    """b, i or f for booleans, integers (signed or not) and floats; None for anything else."""
    return {"b": "b", "i": "i", "u": "i", "f": "f"}.get(dtype.kind)


def _field_values(value: Any, at: str, name: str) -> np.ndarray:
    values = _numpy(value, f"{at}, field {name!r}")
    if _kind(values.dtype) is None:
        what = "text" if values.dtype.kind in "US" else f"{values.dtype} values"
        raise ConfigError(f"{at}: field {name!r} holds {what}, not numbers: drop it from the items, or encode it "
                          "as numbers")
    return values


@dataclass
class Fields:
    """Dict items: every entry but the label is a field of fixed shape, flattened into the row in the first
    item's key order, all stored in one dtype (the first item's common type, as the importers store it)."""

    fields: list[Field]
    label_key: str
    stored: np.dtype

    @classmethod
    def of(cls, first: Mapping, label_key: str, where: str) -> Fields:
        at = f"{where}: row 1 (index 0)"
        _check_label_key(first, label_key, at)
        fields, start, dtypes = [], 0, []
        for name, value in first.items():
            if name == label_key:
                continue
            if not isinstance(name, str):
                raise ConfigError(f"{at}: key {name!r} is not a name (text); dict items are keyed by names")
            values = _field_values(value, at, name)
            if values.size == 0:
                raise ConfigError(f"{at}: field {name!r} holds no values (shape {values.shape})")
            fields.append(Field(name, values.shape, _kind(values.dtype), start, start + values.size))
            start, dtypes = start + values.size, [*dtypes, values.dtype]
        if not fields:
            raise ConfigError(f"{at} holds only the label {label_key!r}: no fields to learn from")
        return cls(fields, label_key, stored_dtype(np.result_type(*dtypes)))

    def meta(self) -> dict:
        return {"fields": [{"name": field.name, "shape": list(field.shape), "dtype": FIELD_DTYPES[field.kind]}
                           for field in self.fields], "label_key": self.label_key}

    def row(self, item: Any, at: str) -> tuple[np.ndarray, np.ndarray]:
        """The item's fields flattened into one row, and its label; a field unlike row 1's is named."""
        if not isinstance(item, Mapping):
            raise ConfigError(f"{at} is a {type(item).__name__}, not a dict as row 1 is")
        _check_label_key(item, self.label_key, at)
        values = []
        for field in self.fields:
            if field.name not in item:
                raise ConfigError(f"{at} has no field {field.name!r}, which row 1 has (its keys: {_keys(item)})")
            value = _field_values(item[field.name], at, field.name)
            if value.shape != field.shape:
                raise ConfigError(f"{at}: field {field.name!r} has shape {value.shape}; row 1's has {field.shape}")
            if _kind(value.dtype) != field.kind:
                raise ConfigError(f"{at}: field {field.name!r} holds {value.dtype} values; row 1's holds "
                                  f"{KIND_WORDS[field.kind]}")
            values.append(value.reshape(-1))
        if len(item) != len(self.fields) + 1:
            names = {field.name for field in self.fields}
            extra = next(key for key in item if key != self.label_key and key not in names)
            raise ConfigError(f"{at} has field {extra!r}, which row 1 has not")
        return np.concatenate(values), _label(item[self.label_key], at)

    def stack(self, rows: list, start: int, where: str) -> tuple[np.ndarray, np.ndarray]:
        """A chunk's rows in the stored dtype; an integer it would change is refused, naming its row."""
        features = np.stack([values for values, _ in rows])
        stored = features.astype(self.stored)
        for field in self.fields:
            if field.kind == "f":  # floats are kept to the stored precision, as the importers keep them
                continue
            columns = features[:, field.start : field.stop]
            changed = np.flatnonzero((stored[:, field.start : field.stop] != columns).any(axis=1))
            if len(changed):
                row = start + int(changed[0])
                value = columns[changed[0]][stored[changed[0], field.start : field.stop] != columns[changed[0]]][0]
                raise ConfigError(f"{where}: row {row + 1} (index {row}): field {field.name!r} holds {int(value)}, "
                                  f"which the dataset's {self.stored} values do not hold exactly")
        return stored, np.concatenate([label for _, label in rows])


def _keys(item: Mapping) -> str:
    return ", ".join(map(repr, item))


def _check_label_key(item: Mapping, label_key: str, at: str) -> None:
    if label_key not in item:
        raise ConfigError(f"{at} has no label {label_key!r}; its keys are {_keys(item)} (fit's label= names the "
                          "label's key)")


def _plain(item: Any) -> list[tuple[Any, Any]]:
    """An item's parts as NumPy arrays, (key, values) each, to compare two reads of it."""
    parts = item.items() if isinstance(item, Mapping) else enumerate(item) if isinstance(item, (tuple, list)) \
        else [(None, item)]
    plain = []
    for key, value in parts:
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        try:
            plain.append((key, np.asarray(value)))
        except (TypeError, ValueError):  # ragged: the write names it
            plain.append((key, value))
    return plain


def _same(first: list[tuple[Any, Any]], second: list[tuple[Any, Any]]) -> bool:
    """Whether two reads of an item are the same, bit for bit (a NaN equals itself)."""
    if len(first) != len(second):
        return False
    for (key, one), (other_key, other) in zip(first, second):
        if key != other_key or type(one) is not type(other):
            return False
        if isinstance(one, np.ndarray) and one.dtype.kind != "O":
            if one.dtype != other.dtype or one.shape != other.shape or one.tobytes() != other.tobytes():
                return False
            continue
        try:
            if not bool(one.tolist() == other.tolist() if isinstance(one, np.ndarray) else one == other):
                return False
        except (TypeError, ValueError):  # parts that do not compare: the write refuses them
            continue
    return True


def _check_repeatable(data: Any, where: str) -> None:
    """Read the first, middle and last items twice: a Dataset whose `__getitem__` draws at random is refused,
    since the one draw written would serve every epoch."""
    for index in sorted({0, len(data) // 2, len(data) - 1}):
        if not _same(_plain(data[index]), _plain(data[index])):
            raise ConfigError(f"{where}: the Dataset's item {index} differs between two reads (a random transform "
                              f"in __getitem__?): {RANDOM_ADVICE}")


def _check_frame_features(frame: Any, where: str, label: str) -> None:
    """Feature columns must hold numbers: fit has no way to declare a column categorical, so a text or
    category column is the user's to encode (the label column may hold text: it names classes)."""
    for name, dtype in frame.dtypes.items():
        if name == label:
            continue
        if dtype.kind not in "biuf":
            what = "categories" if str(dtype) == "category" else "text" if dtype.kind in "OSU" else "values"
            raise ConfigError(f"{where}: column {name!r} holds {what} ({dtype}), not numbers: encode it before "
                              f"fit, e.g. pandas.get_dummies(frame, columns=[{name!r}], dtype=float)")
        infinite = np.flatnonzero(np.isinf(frame[name].to_numpy(dtype=float, na_value=0.0)))
        if len(infinite):  # a NaN is a null to the importer, which names its row; an infinity is not
            raise DataError(f"{where}: row {infinite[0] + 1} (position {infinite[0]}) of column {name!r} holds "
                            "an infinite value: fix or drop it before fit")


def _write_frame(frame: Any, out: str, where: str, label: str | None, encoding_from: str | None) -> Dataset:
    """Through the Parquet importer, so a frame's columns are read as a Parquet file's would be."""
    from shoal.data.importers import import_dataset

    if label is None:
        raise ConfigError(f"label: required with a DataFrame as {where}: the name of its label column")
    if label not in frame.columns:
        raise ConfigError(f"label: {where} has no column {label!r}")
    _check_frame_features(frame, where, label)
    handle, staged = tempfile.mkstemp(suffix=".parquet", prefix="shoal-frame-")
    os.close(handle)
    try:
        frame.to_parquet(staged, index=False)
        try:
            return import_dataset(staged, out, "parquet", label=label, encoding_from=encoding_from)
        except DataError as error:
            raise DataError(f"{where}: {str(error).replace(staged, 'the DataFrame')}") from None
    finally:
        os.remove(staged)
