"""--workers auto: cNeural's k = min(cores, what memory holds), per machine."""

from __future__ import annotations

import numpy as np

from shoal.api import resolve_job
from shoal.data.format import DatasetWriter
from shoal.train.capacity import LABEL_BYTES, WORKER_FOOTPRINT, auto_workers, share_bytes
from tests.distributed.common import write_dataset

GIB = 2**30


def job(tmp_path, **cluster):
    train = tmp_path / "train"
    if not train.exists():
        write_dataset(train, rows=600, seed=1)
    return resolve_job({"model": {"layers": [{"dense": 2}]}, "data": {"train": str(train)}, "cluster": cluster})


def test_cores_decide_when_memory_is_plenty(tmp_path):
    count, reason = auto_workers(job(tmp_path), available=64 * GIB, core_count=8)
    assert count == 8 and "cores decide" in reason


def test_threads_per_worker_divide_the_cores(tmp_path):
    assert auto_workers(job(tmp_path, threads=2), available=64 * GIB, core_count=8)[0] == 4


def test_memory_decides_with_a_stated_footprint(tmp_path):
    count, reason = auto_workers(job(tmp_path, memory_per_worker="3GiB"), available=10 * GIB, core_count=8)
    assert count == 3 and "memory decide" in reason


def test_torchs_footprint_without_one_and_never_fewer_than_one(tmp_path):
    assert auto_workers(job(tmp_path), available=3 * WORKER_FOOTPRINT + GIB // 10, core_count=8)[0] == 3
    assert auto_workers(job(tmp_path), available=1, core_count=8)[0] == 1


def stored_job(tmp_path, dtype: str):
    """A job over 1000 rows of 784 features stored as `dtype`."""
    path = tmp_path / dtype
    features = np.zeros((1000, 784), dtype=dtype)
    with DatasetWriter(str(path), (784,), dtype) as writer:
        writer.write(features, np.arange(1000) % 2)
    return resolve_job({"model": {"layers": [{"dense": 2}]}, "data": {"train": str(path)}})


def test_the_share_counts_features_in_their_stored_dtype(tmp_path):
    # the loader keeps uint8 images as uint8 (a batch is converted per batch): a byte per feature
    assert share_bytes(stored_job(tmp_path, "uint8")) == 1000 * (784 * 1 + LABEL_BYTES)
    assert share_bytes(stored_job(tmp_path, "float32")) == 1000 * (784 * 4 + LABEL_BYTES)
