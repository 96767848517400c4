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

from shoal.data.format import Dataset, DatasetWriter, open_dataset
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
        return _write_arrays(_numpy(data[0], where), _numpy(data[1], where), out, where)
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return _write_items(data, out, where)
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


def _write_arrays(features: np.ndarray, labels: np.ndarray, out: str, where: str) -> Dataset:
    if features.ndim == 0 or len(features) == 0:
        raise ConfigError(f"{where}: holds no samples")
    labels = labels.reshape(len(labels), -1)
    if labels.shape[1] != 1:
        raise ConfigError(f"{where}: labels have shape {labels.shape}; expected one label per row")
    if len(labels) != len(features):
        raise ConfigError(f"{where}: {len(features)} rows of features but {len(labels)} labels")
    chunks = ((features[start : start + CHUNK_ROWS], labels[start : start + CHUNK_ROWS, 0])
              for start in range(0, len(features), CHUNK_ROWS))
    return _write_chunks(chunks, out, where)


def _write_items(data: Any, out: str, where: str) -> Dataset:
    """A map-style Dataset, CHUNK_ROWS items at a time: memory holds a chunk, not the set."""
    if len(data) == 0:
        raise ConfigError(f"{where}: holds no samples")
    chunks = (_gather(data, start, min(start + CHUNK_ROWS, len(data)), where)
              for start in range(0, len(data), CHUNK_ROWS))
    return _write_chunks(chunks, out, where)


def _write_chunks(chunks, out: str, where: str) -> Dataset:
    """(features, labels) chunks into a dataset shaped like the first; a failure leaves no folder."""
    features, labels = next(chunks)
    if features.dtype.kind not in "biuf":
        raise ConfigError(f"{where}: features have dtype {features.dtype}; expected numbers")
    try:
        with DatasetWriter(out, features.shape[1:] or (1,), stored_dtype(features.dtype)) as writer:
            writer.write(features, labels)
            for features, labels in chunks:
                writer.write(features, labels)
    except DataError as error:
        raise DataError(f"{where}: {error}") from None
    return open_dataset(out)


def _gather(data: Any, start: int, stop: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    features, labels = [], []
    for index in range(start, stop):
        item = data[index]
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ConfigError(f"{where}: item {index} is not a (features, label) pair")
        features.append(_numpy(item[0], f"{where}: item {index}"))
        labels.append(_numpy(item[1], f"{where}: item {index}").reshape(-1)[:1])
    try:
        return np.stack(features), np.concatenate(labels)
    except ValueError as error:
        raise ConfigError(f"{where}: items {start} to {stop - 1} differ in shape: {error}") from None


def _write_frame(frame: Any, out: str, where: str, label: str | None, encoding_from: str | None) -> Dataset:
    """Through the Parquet importer, so a frame's columns are read as a Parquet file's would be."""
    from shoal.data.importers import import_dataset

    if label is None:
        raise ConfigError(f"label: required with a DataFrame as {where}: the name of its label column")
    if label not in frame.columns:
        raise ConfigError(f"label: {where} has no column {label!r}")
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
