"""The per-worker loader: load the rank's share once, read it many times.

Features stay in their stored dtype (uint8 images stay uint8, a quarter of float32) and are
converted per batch: to (inputs, labels), or for rows of dict items to a dict of their fields.
A batch is one fancy-index of the share's array: no per-sample Python.

A share that fits the worker's memory budget (or any share, without a budget) is read into
RAM. A larger one is copied once to a local memory-mapped cache (`ShareCache`) and each epoch
visits it one sub-partition at a time, rows shuffled within, read into two reused buffers, so
resident memory stays near the budget, and later epochs read only the cache, never the store.
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow
import torch

from shoal.data.balance import RowShares, equal_plan
from shoal.data.cache import ShareCache
from shoal.data.format import Dataset
from shoal.data.partition import blocked_epoch_order, blocked_epoch_plan, epoch_order, sub_partitions
from shoal.errors import ConfigError

PARTS_IN_MEMORY = 2  # a batch may straddle two sub-partitions: both must fit the budget


def feature_scale(dtype: np.dtype) -> float:
    """uint8 features are pixel intensities: scaled to [0, 1] on conversion."""
    return 1.0 / 255.0 if np.dtype(dtype) == np.uint8 else 1.0


def plan_memory(share_rows: int, row_bytes: int, batch_size: int, budget: int | None) -> int | None:
    """Rows per sub-partition for a share under a memory budget, or None when it fits in RAM.

    Labels (8 bytes a row) stay in memory; the rest of the budget holds two sub-partitions,
    each at least two batches long so that no batch spans more than two of them.
    """
    if budget is None or share_rows * (row_bytes + 8) <= budget:
        return None
    room = budget - share_rows * 8
    part_rows = room // (PARTS_IN_MEMORY * row_bytes) if room > 0 else 0
    if part_rows < 2 * batch_size:
        need = share_rows * 8 + PARTS_IN_MEMORY * 2 * batch_size * row_bytes
        raise ConfigError(f"data.memory_per_worker: {budget:,} bytes cannot hold this worker's {share_rows:,} labels "
                          f"and two sub-partitions of two batches of {batch_size} rows ({row_bytes:,} bytes each): "
                          f"needs at least {need:,}")
    return int(part_rows)


FIELD_TENSOR_TYPES = {"float32": torch.float32, "int64": torch.int64, "bool": torch.bool}
"""A dict batch's fields, by the dtype the dataset's `fields` record."""


class Converter:
    """Rows in their stored dtype -> (float32 inputs in the model's sample shape, labels) on a device.

    Rows of dict items (`fields`, as the dataset records them) become a dict instead: each field's
    tensor, (rows, *its shape) in its own dtype (float32, int64 or bool, never scaled), and the labels
    under `label_key`.
    """

    def __init__(self, dtype: np.dtype, sample_shape, device: torch.device = torch.device("cpu"),
                 label_dtype: torch.dtype = torch.int64, *, fields: list[dict] | None = None,
                 label_key: str | None = None):
        self.scale = feature_scale(dtype)
        self.sample_shape, self.device, self.label_dtype = tuple(sample_shape), device, label_dtype
        self.fields: list[tuple[str, int, int, tuple[int, ...], torch.dtype]] | None = None
        if fields:
            self.fields, start = [], 0
            for field in fields:
                stop = start + math.prod(field["shape"])
                self.fields.append((field["name"], start, stop, tuple(field["shape"]),
                                    FIELD_TENSOR_TYPES[field["dtype"]]))
                start = stop
        self.label_key = label_key or "label"

    @classmethod
    def for_dataset(cls, dataset: Dataset, sample_shape=None, device: torch.device = torch.device("cpu"),
                    label_dtype: torch.dtype = torch.int64) -> Converter:
        """The converter of `dataset`'s rows: its dtype, and its fields when its rows are dict items."""
        return cls(dataset.feature_dtype, sample_shape or dataset.shape, device, label_dtype,
                   fields=dataset.fields, label_key=dataset.label_key)

    def __call__(self, features: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | dict:
        inputs, targets = torch.from_numpy(features), torch.from_numpy(labels)
        if self.device.type != "cpu":  # on the CPU even a no-op .to() costs a few microseconds a batch
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
        targets = targets if targets.dtype == self.label_dtype else targets.to(self.label_dtype)
        if self.fields is not None:
            return self._fields(inputs, targets)
        inputs = inputs.float().reshape(len(inputs), *self.sample_shape)
        if self.scale != 1.0:
            inputs.mul_(self.scale)
        return inputs, targets

    def _fields(self, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = len(inputs)
        flat = inputs.reshape(rows, -1)
        batch = {name: flat[:, start:stop].reshape(rows, *shape).to(dtype)
                 for name, start, stop, shape, dtype in self.fields}
        batch[self.label_key] = targets
        return batch


def batch_rows(batch: Any) -> int:
    """Rows in a batch as the loader yields it, or a transform returns it: (inputs, labels), a dict of
    tensors, or a tensor; the first tensor of at least one dimension says."""
    if getattr(batch, "ndim", 0) >= 1:
        return int(batch.shape[0])
    parts = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    for part in parts:
        try:
            return batch_rows(part)
        except ValueError:
            continue
    raise ValueError(f"a batch of {type(batch).__name__} holds no tensor with a dimension of rows")


class ShardLoader:
    """One rank's rows of a dataset, served as batches of tensors from memory or a local cache."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        device: torch.device = torch.device("cpu"),
        label_dtype: torch.dtype = torch.int64,
        sample_shape: list[int] | None = None,
        memory_budget: int | None = None,
        cache_dir: str | None = None,
        plan: RowShares | None = None,
    ):
        """`rank` and `world_size` count training workers; `plan` gives their shares (default: equal)."""
        self.dataset = dataset
        self.rank, self.world_size = rank, world_size
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.device, self.label_dtype = device, label_dtype
        self.memory_budget, self.cache_dir = memory_budget, cache_dir
        self.cache: ShareCache | None = None
        self._buffers: list[np.ndarray] = []  # the sub-partitions in memory, allocated once
        self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shoal-cache-reader")
        self.plan = plan or equal_plan(dataset.rows, world_size, batch_size)
        self.start, self.stop = self.plan.range(rank)
        self.steps = self.plan.steps[rank]
        self.features = self.labels = None
        self.load_seconds = self._load(self.start, self.stop)
        self.sample_shape = tuple(sample_shape or dataset.shape)  # the model's view of a row
        self.convert = Converter.for_dataset(dataset, self.sample_shape, device, label_dtype)

    def _load(self, start: int, stop: int) -> float:
        """Hold rows [start, stop): in RAM (keeping the rows already held), or in a fresh local cache; the seconds."""
        began = time.perf_counter()
        dataset = self.dataset
        row_bytes = dataset.features * dataset.feature_dtype.itemsize
        self.part_rows = plan_memory(stop - start, row_bytes, self.plan.largest_batch(self.rank), self.memory_budget)
        if self.cache is not None:  # a cached share is copied anew: its sub-partitions are cut by its size
            self.features, self._buffers = None, []
            self.cache.close()
            self.cache = None
        if self.part_rows is None:
            self.features, self.labels = self._read_keeping(start, stop)
        else:
            self.cache = ShareCache(dataset, start, stop, cache_dir=self.cache_dir, chunk_rows=self.part_rows)
            self.features, self.labels = self.cache.features, self.cache.labels
        self.start, self.stop = start, stop
        pyarrow.default_memory_pool().release_unused()  # Arrow keeps freed read buffers for reuse otherwise
        return time.perf_counter() - began

    def _read_keeping(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [start, stop) into RAM, reading from the dataset only those not already held."""
        kept_from, kept_to = max(start, self.start), min(stop, self.stop)
        if self.features is None or kept_from >= kept_to:
            return self.dataset.read_rows(start, stop)
        pieces = []
        if start < kept_from:
            pieces.append(self.dataset.read_rows(start, kept_from))
        pieces.append((self.features[kept_from - self.start: kept_to - self.start],
                       self.labels[kept_from - self.start: kept_to - self.start]))
        if kept_to < stop:
            pieces.append(self.dataset.read_rows(kept_to, stop))
        if len(pieces) == 1:
            return pieces[0][0].copy(), pieces[0][1].copy()  # a view would keep the whole old share alive
        return np.concatenate([piece[0] for piece in pieces]), np.concatenate([piece[1] for piece in pieces])

    def reshare(self, plan: RowShares) -> float:
        """Follow a new plan from the next epoch: read the rows the new share adds; the seconds it took."""
        start, stop = plan.range(self.rank)
        self.plan, self.steps = plan, plan.steps[self.rank]
        row_bytes = self.dataset.features * self.dataset.feature_dtype.itemsize
        same_parts = plan_memory(stop - start, row_bytes, plan.largest_batch(self.rank),
                                 self.memory_budget) == self.part_rows
        if (start, stop) == (self.start, self.stop) and same_parts:
            return 0.0
        return self._load(start, stop)

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def describe(self) -> dict:
        """How the share is held, for the `data_loaded` event (and the bytes streamed from the job's data
        server, for a machine without the dataset)."""
        streamed = {"streamed_bytes": received} if (received := getattr(self.dataset, "bytes_received", 0)) else {}
        if self.cache is None:
            return {"mode": "memory", "rows": self.rows, **streamed}
        return {"mode": "cache", "rows": self.rows, "sub_partitions": len(sub_partitions(self.rows, self.part_rows)),
                "rows_per_sub_partition": self.part_rows, "cache_reused": self.cache.reused,
                "cache_folder": self.cache.folder if self.cache.keep else None, **streamed}

    def order(self, epoch: int) -> np.ndarray:
        if self.part_rows is not None:
            return blocked_epoch_order(self.rows, self.part_rows, seed=self.seed, epoch=epoch, rank=self.rank,
                                       shuffle=self.shuffle)
        return epoch_order(self.rows, seed=self.seed, epoch=epoch, rank=self.rank, shuffle=self.shuffle)

    def to_tensors(self, features: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | dict:
        return self.convert(features, labels)

    def batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor] | dict]:
        """This epoch's batches, `self.steps` of them, in this rank's seeded order: (inputs, labels), or a dict
        of fields and labels for a dataset of dict items (`Converter`)."""
        if self.cache is not None:
            yield from self._cached_batches(epoch)
            return
        order = self.order(epoch)
        for lo, hi in self.plan.bounds(self.rank):
            if not self.shuffle:
                yield self.to_tensors(self.features[lo:hi], self.labels[lo:hi])
            else:
                index = order[lo:hi]
                yield self.to_tensors(self.features[index], self.labels[index])

    def _cached_batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor] | dict]:
        """Batches out of the sub-partitions they fall in, each read from the cache into a reused buffer.

        The order visits one sub-partition after another, so the rows a batch takes from each are
        one contiguous run of positions: no per-row bookkeeping. As soon as a buffer is free, the
        next sub-partition is read into it in the background (the read releases the GIL), so the
        reading overlaps the training on the current one.
        """
        order, visits = blocked_epoch_plan(self.rows, self.part_rows, seed=self.seed, epoch=epoch, rank=self.rank,
                                           shuffle=self.shuffle)
        parts = sub_partitions(self.rows, self.part_rows)
        if not self._buffers:
            self._buffers = [np.empty((self.part_rows, *self.dataset.shape), self.features.dtype)
                             for _ in range(PARTS_IN_MEMORY)]
        free, held, pending = list(self._buffers), {}, {}  # visit -> its rows; visit -> (rows, read in flight)

        def start_reading(visit: int) -> None:
            if visit < len(visits) and visit not in held and visit not in pending and free:
                first, last = parts[visits[visit][0]]
                rows = free.pop()[: last - first]
                pending[visit] = (rows, self._reader.submit(self.cache.read_into, first, last, rows))

        def rows_of(visit: int) -> np.ndarray:
            if visit not in held:
                start_reading(visit)
                rows, reading = pending.pop(visit)
                reading.result()
                held[visit] = rows
            return held[visit]

        visit = 0
        try:
            for lo, hi in self.plan.bounds(self.rank):
                for finished in [v for v in held if v < visit]:
                    free.append(held.pop(finished).base)
                start_reading(visit)
                start_reading(visit + 1)
                pieces = []
                while True:
                    part, begin, end = visits[visit]
                    a, b = max(lo, begin), min(hi, end)
                    pieces.append(rows_of(visit)[order[a:b] - parts[part][0]])
                    if hi <= end:
                        break
                    visit += 1
                features = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
                yield self.to_tensors(features, self.labels[order[lo:hi]])
                if hi == end and visit + 1 < len(visits):
                    visit += 1
        finally:
            for _, reading in pending.values():  # an abandoned epoch must not leave a read writing a buffer
                reading.result()

    def close(self) -> None:
        """Unmap and, unless kept in a cache folder, remove the local cache."""
        self._reader.shutdown(wait=True)
        if self.cache is not None:
            self.features, self._buffers = None, []
            self.cache.close()


def owned(batch):
    """A batch whose tensors are its own, not views of the rows held (the user's code may change them in place)."""
    if isinstance(batch, dict):
        return {name: value.clone() for name, value in batch.items()}
    return tuple(owned(value) if isinstance(value, dict) else value.clone() for value in batch)
