"""Small datasets, models and references shared by the distributed tests."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from shoal.data.format import DatasetWriter, open_dataset
from shoal.data.partition import batch_bounds, epoch_order, share, steps_per_epoch

FEATURES, CLASSES = 6, 3


def write_dataset(path, rows: int, seed: int = 0) -> str:
    generator = np.random.default_rng(seed)
    features = generator.normal(size=(rows, FEATURES)).astype(np.float32)
    labels = generator.integers(0, CLASSES, size=rows)
    with DatasetWriter(str(path), (FEATURES,), "float32", row_group_size=37) as writer:
        writer.write(features, labels)
    return str(path)


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, CLASSES))


def rank_batches(path: str, world_size: int, batch_size: int, seed: int, epoch: int):
    """For each step, each rank's rows (dataset-wide indices), as the loader would visit them."""
    dataset = open_dataset(path)
    steps = steps_per_epoch(dataset.rows, world_size, batch_size)
    per_rank = []
    for rank in range(world_size):
        start, stop = share(dataset.rows, world_size, rank)
        order = epoch_order(stop - start, seed=seed, epoch=epoch, rank=rank)
        per_rank.append([start + order[lo:hi] for lo, hi in batch_bounds(stop - start, steps, batch_size)])
    return [[per_rank[rank][step] for rank in range(world_size)] for step in range(steps)]


def parameters(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]
