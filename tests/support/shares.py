"""The rows each training worker visits under a share plan, for tests that rebuild training by hand.

A `RowShares` gives worker i the contiguous rows `plan.range(i)` and its batches `plan.bounds(i)` over its
seeded epoch order; the loader visits exactly these rows, so a reference computed from them trains on
the same data as the workers.
"""

from __future__ import annotations

import numpy as np

from shoal.data.balance import RowShares
from shoal.data.format import DatasetWriter
from shoal.data.partition import epoch_order


def worker_batches(plan: RowShares, worker: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The dataset-wide rows of each batch of worker `worker` this epoch, as a loader holding them in RAM reads them."""
    start, stop = plan.range(worker)
    order = epoch_order(stop - start, seed=seed, epoch=epoch, rank=worker)
    return [start + order[lo:hi] for lo, hi in plan.bounds(worker)]


def numbered(path, rows: int, features: int = 1) -> str:
    """A dataset whose feature 0 is the row's number (int32), so a batch tells which rows it holds."""
    values = np.zeros((rows, features), dtype=np.int32)
    values[:, 0] = np.arange(rows)
    with DatasetWriter(str(path), (features,), np.int32, row_group_size=7, rows_per_file=23) as writer:
        writer.write(values, np.arange(rows) % 3)
    return str(path)
