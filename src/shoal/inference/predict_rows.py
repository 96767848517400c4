"""Rows to predict that a Python user holds in memory: `shoal.predict(run, features, out)`.

Predictions are made by processes that read a dataset folder a batch at a time, so rows held in
memory are first written to a temporary dataset folder, shaped as the model's training set was:
an array's columns are the model's features in order, so the folder takes the training set's sample
shape, feature names and encoding. Errors name the array, never the temporary folder, which goes
once the predictions are written.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np

from shoal.cluster import scratch
from shoal.data.format import DatasetWriter
from shoal.data.importers.common import stored_dtype
from shoal.errors import ConfigError, ShoalError

ACCEPTED = ("a dataset folder, an array or tensor of features (one row per sample), "
            "or a (features, labels) pair of them")


def is_folder(dataset: Any) -> bool:
    return isinstance(dataset, (str, os.PathLike))


@contextlib.contextmanager
def dataset_on_disk(dataset: Any, reference: dict) -> Iterator[str]:
    """The folder to predict: `dataset` itself, or rows in memory written to a temporary folder shaped
    like `reference` (the training set's schema) for the block's length; errors there name the array."""
    if is_folder(dataset):
        yield os.fspath(dataset)
        return
    features, labels = _arrays(dataset)
    folder = scratch.make(scratch.PREDICT, sweep_first=True)
    path = os.path.join(folder, "rows")
    try:
        _write(features, labels, path, reference)
        yield path
    except ShoalError as error:
        raise type(error)(re.sub(re.escape(path) + r"(/[^:\s]*)?", "features", str(error))) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _arrays(dataset: Any) -> tuple[np.ndarray, np.ndarray | None]:
    if isinstance(dataset, tuple):
        if len(dataset) != 2:
            raise ConfigError(f"dataset: a tuple of {len(dataset)}; expected {ACCEPTED}")
        return _numbers(dataset[0], "features"), _numbers(dataset[1], "labels", text=True)
    if isinstance(dataset, (np.ndarray, list)) or hasattr(dataset, "detach"):
        return _numbers(dataset, "features"), None
    raise ConfigError(f"dataset: got a {type(dataset).__name__}; expected {ACCEPTED}")


def _numbers(value: Any, name: str, text: bool = False) -> np.ndarray:
    if hasattr(value, "detach"):  # a tensor, wherever it lives
        value = value.detach().cpu().numpy()
    try:
        array = np.asarray(value)
    except ValueError as error:  # rows of different lengths
        raise ConfigError(f"{name}: not an array: {error}") from None
    if text and array.dtype.kind == "O":  # labels as Python strings
        array = array.astype(str)
    if array.dtype.kind not in ("biufUS" if text else "biuf"):
        raise ConfigError(f"{name}: holds {array.dtype} values; expected numbers")
    if array.ndim == 0 or len(array) == 0:
        raise ConfigError(f"{name}: holds no rows")
    return array


def _write(features: np.ndarray, labels: np.ndarray | None, path: str, reference: dict) -> None:
    if features.ndim == 1:
        features = features.reshape(-1, 1)  # one feature per row
    if labels is not None:
        labels = labels.reshape(len(labels), -1)
        if labels.shape[1] != 1:
            raise ConfigError(f"labels: shape {labels.shape}; expected one label per row")
        if len(labels) != len(features):
            raise ConfigError(f"labels: {len(labels)} rows, but features has {len(features)}")
    count = math.prod(features.shape[1:])
    shape = reference.get("shape") if isinstance(reference.get("shape"), list) else None
    matches = shape is not None and math.prod(shape) == count  # else the model's check names the difference
    names = reference.get("feature_names") if matches else None
    encoding = reference.get("encoding") if matches and isinstance(reference.get("encoding"), dict) else None
    with DatasetWriter(path, tuple(shape) if matches else features.shape[1:], stored_dtype(features.dtype),
                       feature_names=names, extra_meta={"encoding": encoding} if encoding else None,
                       labeled=labels is not None) as writer:
        writer.write(features, None if labels is None else labels[:, 0])
