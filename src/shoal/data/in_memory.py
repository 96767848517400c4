"""Datasets from what a Python user already holds: arrays or tensors, a pandas DataFrame, a torch Dataset.

Workers read a dataset folder, each its own share; data held in a notebook's memory is first
written to one, a chunk at a time, by the same writer and checks as the importers. A DataFrame
goes through the Parquet importer, so its text and categorical columns are encoded as a file's
would be, and a test frame takes the training frame's encoding.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from shoal.data.format import Dataset, DatasetWriter, first_non_finite, open_dataset
from shoal.data.importers.common import stored_dtype
from shoal.errors import ConfigError, DataError

CHUNK_ROWS = 8192  # rows of a torch Dataset gathered before each write


def write_in_memory(data: Any, out: str, where: str, *, label: str | None = None,
                    encoding_from: str | None = None) -> Dataset:
    """Write `data` ((features, labels), a DataFrame with its `label` column, or a map-style torch
    Dataset of (features, label) items) as a dataset folder at `out`; `where` names it in errors."""
    if _is_frame(data):
        return _write_frame(data, out, where, label, encoding_from)
    if label is not None:
        raise ConfigError(f"label: names a DataFrame's column; {where} is a {type(data).__name__}")
    if isinstance(data, (tuple, list)):
        if len(data) != 2:
            raise ConfigError(f"{where}: expected (features, labels), got a sequence of {len(data)}")
        return _write_arrays(_numpy(data[0], where), _numpy(data[1], where), out, where, encoding_from)
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return _write_items(data, out, where, encoding_from)
    raise ConfigError(f"{where}: expected a dataset folder, (features, labels) arrays, a pandas DataFrame "
                      f"or a torch Dataset, got {type(data).__name__}")


def _is_frame(data: Any) -> bool:
    return type(data).__name__ == "DataFrame" and hasattr(data, "columns")


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
    return _write_chunks(chunks, out, where, classes_from)


def _write_items(data: Any, out: str, where: str, classes_from: str | None) -> Dataset:
    """A map-style Dataset, CHUNK_ROWS items at a time: memory holds a chunk, not the set."""
    if len(data) == 0:
        raise ConfigError(f"{where}: holds no samples")
    chunks = ((start, *_gather(data, start, min(start + CHUNK_ROWS, len(data)), where))
              for start in range(0, len(data), CHUNK_ROWS))
    return _write_chunks(chunks, out, where, classes_from)


def _write_chunks(chunks, out: str, where: str, classes_from: str | None) -> Dataset:
    """(first row, features, labels) chunks into a dataset shaped like the first; a failure leaves no folder.

    Each chunk is checked before it is written, so that a bad row is named by its place in the user's
    data, not in a folder the user never made. A test set takes its training set's classes
    (`classes_from`): it may hold fewer of them, not others."""
    start, features, labels = next(chunks)
    if features.dtype.kind not in "biuf":
        raise ConfigError(f"{where}: features have dtype {features.dtype}; expected numbers")
    classes = open_dataset(classes_from).classes if classes_from else None
    try:
        with DatasetWriter(out, features.shape[1:] or (1,), stored_dtype(features.dtype),
                           classes=classes) as writer:
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


def _gather(data: Any, start: int, stop: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    features, labels = [], []
    for index in range(start, stop):
        item, at = data[index], f"{where}: row {index + 1} (index {index})"  # counted from 1, as NaN rows are
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ConfigError(f"{at} is not a (features, label) pair")
        features.append(_numpy(item[0], at))
        labels.append(_label(item[1], at))
    try:
        return np.stack(features), np.concatenate(labels)
    except ValueError as error:
        raise ConfigError(f"{where}: rows {start + 1} to {stop} (indices {start} to {stop - 1}) differ in shape: "
                          f"{error}") from None


def _label(value: Any, where: str) -> np.ndarray:
    """One label per item: a dataset stores one value per row, and cutting the rest would train on less."""
    label = _numpy(value, where).reshape(-1)
    if label.size != 1:
        raise ConfigError(f"{where}: label has {label.size} elements, shape {tuple(np.shape(value))}; "
                          f"expected one value (a class or a number)")
    return label


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
