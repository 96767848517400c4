"""The rows a job holds out of training to report validation metrics on (`train.validation_split`).

As in Kennedy et al., each training worker holds out part of the data and reports its model's
metrics on it after every epoch. The held-out rows are drawn from the whole dataset by the job's
seed, not from each worker's share, so they do not depend on how many workers there are: a job
resumed on other workers holds out the same rows and trains on the same others. `TrainingRows`
shows a dataset without them, as a dataset the loader and the share cache read like any other;
`validation_rows` gives each trainer its slice of them. Both read the stored rows in bounded
pieces around the held-out ones, so memory stays near the rows asked for.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from shoal.data.format import ROW_GROUP_BYTES, Dataset
from shoal.errors import ConfigError

KEY = "train.validation_split"
DRAW_BLOCK_ROWS = 2**20
"""The draw picks how many held-out rows fall in each block of this many rows, then which ones: its memory
stays near the held-out rows' (a permutation of every row would take 8 bytes a row)."""
HOLDOUT_STREAM = 0x686F6C646F7574  # "holdout": keeps this draw apart from the job's other seeded draws
READ_BYTES = ROW_GROUP_BYTES
"""Stored rows read at a time around the held-out rows."""


def held_out_count(rows: int, split: Any) -> int:
    """round(split * rows) rows (at least one when split > 0); a split that is no share, or that leaves no
    row to train on, is a one-line `ConfigError` naming the key."""
    if isinstance(split, bool) or not isinstance(split, (int, float)) or not (math.isfinite(split)
                                                                              and 0 <= split < 1):
        raise ConfigError(f"{KEY}: must be a share from 0 to below 1, got {split!r}")
    count = max(1, round(split * rows)) if split > 0 else 0
    if rows - count < 1:
        raise ConfigError(f"{KEY}: {split} of the training set's {rows:,} row(s) holds out {count:,}, leaving "
                          "no row to train on: hold out a smaller share, or none")
    return count


def held_out_rows(rows: int, split: Any, seed: int) -> np.ndarray:
    """The sorted dataset rows held out of training: exactly `held_out_count(rows, split)` of them, drawn
    uniformly by `seed` alone (the same for any number of workers)."""
    count = held_out_count(rows, split)
    if count == 0:
        return np.empty(0, np.int64)
    generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(HOLDOUT_STREAM,))))
    starts = np.arange(0, rows, DRAW_BLOCK_ROWS)
    sizes = np.diff(np.append(starts, rows))
    # how many fall in each block, as a draw of `count` among all rows would give; then which, per block
    counts = generator.multivariate_hypergeometric(sizes, count) if len(sizes) > 1 else np.array([count])
    pieces = [start + np.sort(generator.choice(size, taken, replace=False))
              for start, size, taken in zip(starts, sizes, counts, strict=True) if taken]
    return np.concatenate(pieces).astype(np.int64, copy=False)


def chunk_rows(dataset: Any) -> int:
    """Stored rows read at a time: `READ_BYTES` of features."""
    return max(1, READ_BYTES // (dataset.features * dataset.feature_dtype.itemsize))


def class_indices(dataset: Any, labels: list[np.ndarray]) -> np.ndarray:
    """Raw labels read in pieces as the dataset's class indices (or regression targets)."""
    if not labels:
        return np.empty(0, np.int64 if dataset.classes is not None else np.float32)
    return dataset.label_indices(np.concatenate(labels), dataset.path)


class TrainingRows:
    """A dataset without its held-out rows, itself a dataset: `rows` counts the training rows, and
    `read_rows`, `iter_rows` and `read_all` give them in order; everything else (shape, features,
    classes, path, label_indices, ...) is the dataset's own. Its fingerprint also tells the held-out rows,
    so a kept share cache of other rows is never reused for it."""

    def __init__(self, dataset: Dataset, held: np.ndarray):
        held = np.asarray(held, np.int64)
        if held.ndim != 1 or (len(held) and (held[0] < 0 or held[-1] >= dataset.rows
                                              or not np.all(np.diff(held) > 0))):
            raise ValueError(f"held-out rows must be sorted, distinct rows of 0..{dataset.rows - 1}")
        self.dataset, self.held = dataset, held
        self.rows: int = dataset.rows - len(held)
        self._before = held - np.arange(len(held))  # training rows before each held-out row
        self._held_digest: str | None = None

    def __getattr__(self, name: str) -> Any:
        dataset = self.__dict__.get("dataset")  # absent while a copy is being built
        if dataset is None:
            raise AttributeError(name)
        return getattr(dataset, name)

    def __repr__(self) -> str:
        return f"TrainingRows({self.dataset.path!r}, {self.rows} of {self.dataset.rows} rows)"

    def dataset_row(self, position: int) -> int:
        """The dataset's row that is training row `position`."""
        return int(position + np.searchsorted(self._before, position, side="right"))

    def fingerprint(self) -> str:
        """The dataset's fingerprint and the held-out rows': what names a kept share cache of these rows."""
        if not len(self.held):
            return self.dataset.fingerprint()
        if self._held_digest is None:
            self._held_digest = hashlib.sha256(self.held.astype("<i8").tobytes()).hexdigest()
        return hashlib.sha256(f"{self.dataset.fingerprint()}:held:{self._held_digest}".encode()).hexdigest()

    def iter_rows(self, start: int, stop: int, max_rows: int | None = None, *,
                  finite: bool = False) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Training rows [start, stop) in pieces, as `Dataset.iter_rows` gives them: (position in the range,
        flat features, raw labels). The dataset's rows from the first to the last of them are read, at most
        `max_rows` at a time, and the held-out ones among them dropped."""
        if not 0 <= start <= stop <= self.rows:
            raise ValueError(f"row range [{start}, {stop}) outside 0..{self.rows}")
        if start == stop:
            return
        lo, hi = self.dataset_row(start), self.dataset_row(stop - 1) + 1
        position = 0
        for at, block, label in self.dataset.iter_rows(lo, hi, max_rows, finite=finite):
            first = lo + at
            a, b = np.searchsorted(self.held, [first, first + len(block)])
            if a < b:
                dropped = self.held[a:b] - first
                block, label = np.delete(block, dropped, axis=0), np.delete(label, dropped)
            if len(block):
                yield position, block, label
                position += len(block)

    def read_rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Features (stop-start, *shape) in their stored dtype and class indices of training rows [start, stop);
        like the dataset's own, a NaN or infinite value is a `DataError`."""
        if not 0 <= start <= stop <= self.rows:
            raise ValueError(f"row range [{start}, {stop}) outside 0..{self.rows}")
        if start < stop:
            lo, hi = self.dataset_row(start), self.dataset_row(stop - 1) + 1
            if hi - lo == stop - start:  # no row held out in between: the dataset's own read
                return self.dataset.read_rows(lo, hi)
        count = stop - start
        features = np.empty((count, *self.dataset.shape), self.dataset.feature_dtype)
        flat = features.reshape(count, self.dataset.features)
        labels = []
        for position, block, label in self.iter_rows(start, stop, chunk_rows(self.dataset), finite=True):
            flat[position : position + len(block)] = block
            labels.append(label)
        return features, class_indices(self.dataset, labels)

    def read_all(self) -> tuple[np.ndarray, np.ndarray]:
        return self.read_rows(0, self.rows)


def read_ranges(rows: np.ndarray, gap: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges covering sorted rows, one range across any gap of at most `gap` rows: reading a short
    gap costs less than opening the rows again after it."""
    if not len(rows):
        return []
    breaks = np.flatnonzero(np.diff(rows) > gap + 1) + 1
    firsts = rows[np.concatenate([[0], breaks])]
    lasts = rows[np.concatenate([breaks - 1, [len(rows) - 1]])]
    return [(int(first), int(last) + 1) for first, last in zip(firsts, lasts, strict=True)]


def validation_rows(dataset: Dataset, held: np.ndarray, trainer: int, trainers: int) -> tuple[np.ndarray,
                                                                                                np.ndarray]:
    """(features, class indices) of trainer `trainer`'s slice of the held-out rows: the `trainer`-th of
    `trainers` contiguous, near-equal slices of them in order (`np.array_split`'s)."""
    if not 0 <= trainer < trainers:
        raise ValueError(f"trainer {trainer} outside 0..{trainers - 1}")
    mine = np.array_split(np.asarray(held, np.int64), trainers)[trainer]
    features = np.empty((len(mine), *dataset.shape), dataset.feature_dtype)
    flat = features.reshape(len(mine), dataset.features)
    labels, position, chunk = [], 0, chunk_rows(dataset)
    for lo, hi in read_ranges(mine, chunk):
        for at, block, label in dataset.iter_rows(lo, hi, chunk, finite=True):
            first = lo + at
            a, b = np.searchsorted(mine, [first, first + len(block)])
            taken = mine[a:b] - first
            flat[position : position + len(taken)] = block[taken]
            labels.append(label[taken])
            position += len(taken)
    return features, class_indices(dataset, labels)
