"""The per-worker loader: load the rank's share once, read it many times from memory.

Features stay in their stored dtype (uint8 images stay uint8, a quarter of float32) and are
converted per batch. A batch is one fancy-index of the share's array: no per-sample Python.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import torch

from shoal.data.format import Dataset
from shoal.data.partition import batch_bounds, epoch_order, share, steps_per_epoch


def feature_scale(dtype: np.dtype) -> float:
    """uint8 features are pixel intensities: scaled to [0, 1] on conversion."""
    return 1.0 / 255.0 if np.dtype(dtype) == np.uint8 else 1.0


class ShardLoader:
    """One rank's rows of a dataset, held in memory, served as batches of tensors."""

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
    ):
        self.dataset = dataset
        self.rank, self.world_size = rank, world_size
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.device, self.label_dtype = device, label_dtype
        self.steps = steps_per_epoch(dataset.rows, world_size, batch_size)
        self.start, self.stop = share(dataset.rows, world_size, rank)
        began = time.perf_counter()
        self.features, self.labels = dataset.read_rows(self.start, self.stop)
        self.load_seconds = time.perf_counter() - began
        self.scale = feature_scale(self.features.dtype)
        self.sample_shape = tuple(sample_shape or dataset.shape)  # the model's view of a row

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def order(self, epoch: int) -> np.ndarray:
        return epoch_order(self.rows, seed=self.seed, epoch=epoch, rank=self.rank, shuffle=self.shuffle)

    def to_tensors(self, features: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.from_numpy(features).to(self.device, non_blocking=True).float()
        inputs = inputs.reshape(len(inputs), *self.sample_shape)
        if self.scale != 1.0:
            inputs.mul_(self.scale)
        return inputs, torch.from_numpy(labels).to(self.device, self.label_dtype, non_blocking=True)

    def batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This epoch's batches, `self.steps` of them, in this rank's seeded order."""
        order = self.order(epoch)
        for lo, hi in batch_bounds(self.rows, self.steps, self.batch_size):
            index = order[lo:hi]
            if not self.shuffle:
                yield self.to_tensors(self.features[lo:hi], self.labels[lo:hi])
            else:
                yield self.to_tensors(self.features[index], self.labels[index])
