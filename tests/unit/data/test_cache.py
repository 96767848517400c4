"""Shares larger than the memory budget: the local cache, sub-partitions, and reuse across runs."""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.data.format import META_FILE, DatasetWriter, open_dataset
from shoal.data.loader import ShardLoader, plan_memory
from shoal.data.partition import blocked_epoch_order, sub_partitions
from shoal.errors import ConfigError

ROW_BYTES = 4  # one int32 feature per row: the row's own number


def numbered(path: Path, rows: int, group_rows: int = 7) -> None:
    """A dataset whose only feature is the row's number, so a batch tells which rows it holds."""
    with DatasetWriter(str(path), (1,), np.int32, row_group_size=group_rows, rows_per_file=23) as writer:
        writer.write(np.arange(rows, dtype=np.int32).reshape(rows, 1), np.arange(rows) % 3)


def rows_seen(loader: ShardLoader, epoch: int) -> list[int]:
    return [int(v) for inputs, _ in loader.batches(epoch) for v in inputs.reshape(-1).tolist()]


def budget_for(part_rows: int, share_rows: int) -> int:
    """The budget that gives sub-partitions of `part_rows` rows (labels stay in memory)."""
    return share_rows * 8 + 2 * part_rows * ROW_BYTES


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(2, 400), world_size=st.integers(1, 5), batch_size=st.integers(1, 40),
       parts=st.integers(1, 12), shuffle=st.booleans(), epoch=st.integers(0, 3))
def test_every_row_once_per_epoch_across_ranks_under_any_budget(rows, world_size, batch_size, parts, shuffle, epoch):
    """The budget asks for about `parts` sub-partitions per share (1: the share fits in memory)."""
    world_size = min(world_size, rows)
    share_rows = -(-rows // world_size)
    part_rows = max(2 * batch_size, share_rows // parts)
    budget = share_rows * (ROW_BYTES + 8) if parts == 1 else budget_for(part_rows, share_rows)
    with tempfile.TemporaryDirectory() as folder:
        numbered(Path(folder) / "data", rows)
        seen: list[int] = []
        for rank in range(world_size):
            loader = ShardLoader(open_dataset(f"{folder}/data"), rank=rank, world_size=world_size,
                                 batch_size=batch_size, seed=5, shuffle=shuffle, memory_budget=budget,
                                 cache_dir=f"{folder}/cache")
            assert (loader.cache is None) == (loader.rows * (ROW_BYTES + 8) <= budget)
            seen += rows_seen(loader, epoch)
            loader.close()
        assert Counter(seen) == Counter(range(rows))  # every row exactly once, across all ranks


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 3000), part_rows=st.integers(2, 400))
def test_sub_partitions_are_balanced_and_hold_two_half_parts(rows, part_rows):
    parts = sub_partitions(rows, part_rows)
    assert parts[0][0] == 0 and parts[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    sizes = [hi - lo for lo, hi in parts]
    assert max(sizes) <= part_rows and max(sizes) - min(sizes) <= 1
    assert len(parts) == -(-rows // part_rows)
    if len(parts) > 1:
        assert min(sizes) >= part_rows // 2  # so a batch of part_rows // 2 rows spans at most two


def test_blocked_order_visits_one_sub_partition_at_a_time():
    order = blocked_epoch_order(103, 10, seed=1, epoch=2, rank=0)
    assert sorted(order.tolist()) == list(range(103))
    starts = np.array([lo for lo, _ in sub_partitions(103, 10)])
    parts = np.searchsorted(starts, order, side="right") - 1
    changes = np.flatnonzero(np.diff(parts)) + 1
    assert len(changes) == len(starts) - 1  # each part is entered once
    assert blocked_epoch_order(103, 10, seed=1, epoch=2, rank=0).tolist() == order.tolist()
    assert blocked_epoch_order(103, 10, seed=1, epoch=3, rank=0).tolist() != order.tolist()


@pytest.fixture
def digits_like(tmp_path):
    """2,000 rows of 100 uint8 features in groups of 128 rows."""
    generator = np.random.default_rng(0)
    features = generator.integers(0, 256, (2000, 100), dtype=np.uint8)
    labels = generator.integers(0, 4, 2000)
    with DatasetWriter(str(tmp_path / "data"), (10, 10), np.uint8, row_group_size=128) as writer:
        writer.write(features, labels)
    return tmp_path / "data", features, labels


def test_a_share_over_budget_is_cached_and_later_epochs_read_only_the_cache(digits_like, tmp_path):
    path, features, labels = digits_like
    dataset = open_dataset(str(path))
    loader = ShardLoader(dataset, rank=1, world_size=2, batch_size=50, seed=0, memory_budget=40_000)
    assert loader.cache is not None and loader.part_rows == (40_000 - 1000 * 8) // (2 * 100)
    assert loader.describe()["sub_partitions"] == len(sub_partitions(1000, loader.part_rows))
    opened = list(dataset.opened)
    assert {group for _, group in opened} == set(range(1000 // 128, (2000 - 1) // 128 + 1))  # its own groups only
    np.testing.assert_array_equal(loader.features, features[1000:].reshape(1000, 10, 10))
    np.testing.assert_array_equal(loader.labels, labels[1000:])
    for epoch in range(3):
        batches = list(loader.batches(epoch))
        assert sum(len(y) for _, y in batches) == 1000
    assert dataset.opened == opened  # the epochs read the cache, never the store again
    folder = loader.cache.folder
    assert os.path.isdir(folder)
    loader.close()
    assert not os.path.exists(folder)  # a temporary cache goes with the loader


def test_cached_batches_hold_the_same_rows_and_labels_as_memory(digits_like):
    path, _, _ = digits_like
    plain = ShardLoader(open_dataset(str(path)), rank=0, world_size=1, batch_size=64, seed=3, shuffle=False)
    cached = ShardLoader(open_dataset(str(path)), rank=0, world_size=1, batch_size=64, seed=3, shuffle=False,
                         memory_budget=60_000)
    assert cached.cache is not None
    for (x1, y1), (x2, y2) in zip(plain.batches(0), cached.batches(0), strict=True):
        assert torch_equal(x1, x2) and torch_equal(y1, y2)
    cached.close()


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def test_a_cache_folder_is_reused_while_the_dataset_is_unchanged(digits_like, tmp_path):
    path, features, _ = digits_like
    cache_dir = str(tmp_path / "cache")
    first = ShardLoader(open_dataset(str(path)), rank=0, world_size=1, batch_size=50, seed=0,
                        memory_budget=40_000, cache_dir=cache_dir)
    assert first.describe()["cache_reused"] is False
    first.close()
    kept = sorted(os.listdir(cache_dir))
    assert len(kept) == 3 and all(name.startswith("share-") for name in kept)

    dataset = open_dataset(str(path))
    again = ShardLoader(dataset, rank=0, world_size=1, batch_size=50, seed=0, memory_budget=40_000,
                        cache_dir=cache_dir)
    assert again.describe()["cache_reused"] is True
    assert dataset.opened == []  # not one row group read from the store
    np.testing.assert_array_equal(again.features.reshape(2000, 100), features)
    again.close()

    # Rewriting the dataset changes its fingerprint: the old cache is not used.
    with DatasetWriter(str(path), (10, 10), np.uint8, row_group_size=128, overwrite=True) as writer:
        writer.write(features[::-1], np.zeros(2000, dtype=np.int64))
    changed = ShardLoader(open_dataset(str(path)), rank=0, world_size=1, batch_size=50, seed=0,
                          memory_budget=40_000, cache_dir=cache_dir)
    assert changed.describe()["cache_reused"] is False
    np.testing.assert_array_equal(changed.features.reshape(2000, 100), features[::-1])
    changed.close()


def test_an_unfinished_cache_is_not_reused(digits_like, tmp_path):
    path, _, _ = digits_like
    cache_dir = tmp_path / "cache"
    loader = ShardLoader(open_dataset(str(path)), rank=0, world_size=1, batch_size=50, seed=0,
                         memory_budget=40_000, cache_dir=str(cache_dir))
    loader.close()
    marker = next(cache_dir.glob("*.json"))
    marker.unlink()  # as if the writer died before publishing the marker
    again = ShardLoader(open_dataset(str(path)), rank=0, world_size=1, batch_size=50, seed=0,
                        memory_budget=40_000, cache_dir=str(cache_dir))
    assert again.describe()["cache_reused"] is False
    again.close()


def test_a_budget_too_small_for_two_batches_is_a_config_error():
    assert plan_memory(1000, 100, 10, None) is None
    assert plan_memory(1000, 100, 10, 1000 * 108) is None  # fits: held in memory
    assert plan_memory(1000, 100, 10, 12_000) == 20  # two sub-partitions of two batches
    with pytest.raises(ConfigError, match=r"^data\.memory_per_worker: .* needs at least 12,000"):
        plan_memory(1000, 100, 10, 11_999)


def test_version_one_datasets_with_list_features_are_still_read(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    features = np.arange(60, dtype=np.float32).reshape(20, 3)
    column = pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), 3)
    pq.write_table(pa.table({"features": column, "label": pa.array(np.arange(20) % 2)}), folder / "part-00000.parquet",
                   row_group_size=8)
    meta = {"format": "shoal.dataset", "version": 1, "rows": 20, "shape": [3], "feature_dtype": "float32",
            "classes": [0, 1], "files": [{"name": "part-00000.parquet", "rows": 20, "row_groups": [8, 8, 4]}]}
    (folder / META_FILE).write_text(json.dumps(meta))
    read, labels = open_dataset(str(folder)).read_rows(5, 17)
    np.testing.assert_array_equal(read, features[5:17])
    np.testing.assert_array_equal(labels, np.arange(5, 17) % 2)


def test_a_cache_temporary_is_created_new_never_through_a_link(digits_like, tmp_path, monkeypatch):
    from shoal.data import cache
    from shoal.errors import DataError

    path, _, _ = digits_like
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    monkeypatch.setattr(cache.leftovers, "owned_name", lambda stem: f"{stem}.foreseen.tmp")  # a name guessed
    monkeypatch.setattr(type(open_dataset(str(path))), "fingerprint", lambda self: "fixed")
    for part in cache.PARTS:
        (cache_dir / f"share-fixed-rows-0-2000{part}.foreseen.tmp").symlink_to(victim)
    with pytest.raises(DataError) as caught:
        ShardLoader(open_dataset(str(path)), rank=0, world_size=1, batch_size=50, seed=0, memory_budget=40_000,
                    cache_dir=str(cache_dir))
    assert str(caught.value) == f"{cache_dir}: cannot write the local cache of the share: File exists"
    assert victim.read_text() == "the user's own file\n"
