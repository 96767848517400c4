"""The partition plan (shares, steps, batches, epoch orders) and the per-rank loader built on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shoal.data.format import DatasetWriter, open_dataset
from shoal.data.loader import ShardLoader, feature_scale
from shoal.data.partition import batch_bounds, epoch_order, share, steps_per_epoch
from shoal.errors import DataError

rows_strategy = st.integers(1, 5000)
world_strategy = st.integers(1, 16)
batch_strategy = st.integers(1, 300)
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- the plan, property by property


@FAST
@given(rows=rows_strategy, world_size=world_strategy)
def test_shares_are_contiguous_disjoint_and_cover_every_row(rows, world_size):
    assume(rows >= world_size)
    shares = [share(rows, world_size, rank) for rank in range(world_size)]
    assert shares[0][0] == 0
    assert shares[-1][1] == rows
    for (_, stop), (start, _) in zip(shares[:-1], shares[1:], strict=True):
        assert stop == start  # contiguous and disjoint: each starts where the previous stopped
    sizes = [stop - start for start, stop in shares]
    assert all(size >= 1 for size in sizes)
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == rows
    covered = np.concatenate([np.arange(start, stop) for start, stop in shares])
    np.testing.assert_array_equal(covered, np.arange(rows))


@FAST
@given(rows=rows_strategy, world_size=world_strategy, batch_size=batch_strategy)
def test_every_rank_runs_the_same_steps_and_batches_cover_its_share(rows, world_size, batch_size):
    assume(rows >= world_size)
    steps = steps_per_epoch(rows, world_size, batch_size)
    smallest = min(stop - start for start, stop in (share(rows, world_size, r) for r in range(world_size)))
    assert steps == -(-smallest // batch_size)  # enough batches for the smallest share, no more
    assert steps >= 1
    for rank in range(world_size):
        start, stop = share(rows, world_size, rank)
        bounds = batch_bounds(stop - start, steps, batch_size)
        assert len(bounds) == steps  # same step count on every rank
        positions = np.concatenate([np.arange(lo, hi) for lo, hi in bounds])
        np.testing.assert_array_equal(positions, np.arange(stop - start))  # each position exactly once
        assert all(hi > lo for lo, hi in bounds)
        assert all(hi - lo == batch_size for lo, hi in bounds[:-1])


@FAST
@given(share_rows=st.integers(1, 2000), seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 1000),
       rank=st.integers(0, 15))
def test_epoch_order_is_a_deterministic_permutation(share_rows, seed, epoch, rank):
    order = epoch_order(share_rows, seed=seed, epoch=epoch, rank=rank)
    np.testing.assert_array_equal(np.sort(order), np.arange(share_rows))
    again = epoch_order(share_rows, seed=seed, epoch=epoch, rank=rank)
    np.testing.assert_array_equal(order, again)


@FAST
@given(share_rows=st.integers(20, 2000), seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 1000),
       rank=st.integers(0, 15))
def test_epoch_order_changes_between_epochs_seeds_and_ranks(share_rows, seed, epoch, rank):
    order = epoch_order(share_rows, seed=seed, epoch=epoch, rank=rank)
    # with 20 or more rows two independent permutations coincide with probability < 1e-18
    assert not np.array_equal(order, epoch_order(share_rows, seed=seed, epoch=epoch + 1, rank=rank))
    assert not np.array_equal(order, epoch_order(share_rows, seed=seed + 1, epoch=epoch, rank=rank))
    assert not np.array_equal(order, epoch_order(share_rows, seed=seed, epoch=epoch, rank=rank + 1))


@FAST
@given(share_rows=st.integers(0, 2000), seed=st.integers(0, 100), epoch=st.integers(0, 100))
def test_epoch_order_without_shuffle_is_arange(share_rows, seed, epoch):
    order = epoch_order(share_rows, seed=seed, epoch=epoch, rank=0, shuffle=False)
    np.testing.assert_array_equal(order, np.arange(share_rows))


@FAST
@given(world_size=st.integers(2, 16), data=st.data())
def test_fewer_rows_than_workers_is_a_data_error(world_size, data):
    rows = data.draw(st.integers(0, world_size - 1))
    with pytest.raises(DataError) as caught:
        steps_per_epoch(rows, world_size, 8)
    assert f"{rows} rows" in str(caught.value) and f"{world_size} workers" in str(caught.value)


def test_share_examples():
    assert [share(10, 3, r) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [share(9, 3, r) for r in range(3)] == [(0, 3), (3, 6), (6, 9)]
    assert steps_per_epoch(10, 3, 2) == 2  # smallest share 3 -> 2 batches
    assert batch_bounds(4, 2, 2) == [(0, 2), (2, 4)]
    assert batch_bounds(3, 2, 2) == [(0, 2), (2, 3)]


# ---------------------------------------------------------------- the loader on a real dataset

ROWS = 103
GROUP = 10


@pytest.fixture(scope="module")
def id_dataset(tmp_path_factory):
    """103 rows; feature 0 is the row id, feature 1 its double; label = id % 3; groups of 10 rows."""
    path = tmp_path_factory.mktemp("data") / "ids"
    ids = np.arange(ROWS)
    features = np.stack([ids, 2 * ids, np.zeros(ROWS)], axis=1).astype(np.float32)
    with DatasetWriter(str(path), (3,), "float32", rows_per_file=40, row_group_size=GROUP) as writer:
        writer.write(features[:55], ids[:55] % 3)
        writer.write(features[55:], ids[55:] % 3)
    return str(path)


def group_ranges(dataset) -> dict[tuple[str, int], tuple[int, int]]:
    """(file, group) -> [first, stop) rows, computed from meta.json."""
    ranges, offset = {}, 0
    for info in dataset.files:
        for group, rows in enumerate(info.row_groups):
            ranges[(info.name, group)] = (offset, offset + rows)
            offset += rows
    return ranges


def test_dataset_has_many_groups(id_dataset):
    dataset = open_dataset(id_dataset)
    assert [f.row_groups for f in dataset.files] == [(10, 10, 10, 10), (10, 10, 10, 10), (10, 10, 3)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7, 16])
@pytest.mark.parametrize("batch_size", [1, 4, 9, 200])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_row_once_per_epoch_across_ranks(id_dataset, world_size, batch_size, shuffle):
    loaders = [
        ShardLoader(open_dataset(id_dataset), rank=rank, world_size=world_size, batch_size=batch_size,
                    seed=5, shuffle=shuffle)
        for rank in range(world_size)
    ]
    expected_steps = -(-(ROWS // world_size) // batch_size)
    for epoch in range(2):
        seen = []
        for loader in loaders:
            assert loader.steps == expected_steps
            batches = list(loader.batches(epoch))
            assert len(batches) == loader.steps
            for inputs, labels in batches:
                assert inputs.dtype == torch.float32 and labels.dtype == torch.int64
                assert inputs.shape[1:] == (3,)
                values, targets = inputs.numpy(), labels.numpy()
                ids = values[:, 0].astype(np.int64)
                assert np.array_equal(values[:, 1], 2 * values[:, 0])  # rows are not torn apart
                assert np.array_equal(targets, ids % 3)  # labels follow their rows
                assert ids.min() >= loader.start and ids.max() < loader.stop  # only its own share
                seen.extend(ids.tolist())
        assert sorted(seen) == list(range(ROWS))


def test_shuffled_epochs_differ_and_unshuffled_are_in_order(id_dataset):
    dataset = open_dataset(id_dataset)
    shuffled = ShardLoader(dataset, rank=0, world_size=1, batch_size=ROWS, seed=1)
    (first, _), = shuffled.batches(0)
    (second, _), = shuffled.batches(1)
    (first_again, _), = shuffled.batches(0)
    assert not torch.equal(first, second)
    assert torch.equal(first, first_again)
    np.testing.assert_array_equal(first[:, 0].numpy(), shuffled.order(0).astype(np.float32))
    ordered = ShardLoader(dataset, rank=0, world_size=1, batch_size=ROWS, seed=1, shuffle=False)
    (inputs, _), = ordered.batches(0)
    np.testing.assert_array_equal(inputs[:, 0].numpy(), np.arange(ROWS, dtype=np.float32))


@pytest.mark.parametrize("world_size", [2, 3, 5, 8])
def test_each_rank_reads_only_its_row_groups(id_dataset, world_size):
    opened_everywhere = set()
    for rank in range(world_size):
        dataset = open_dataset(id_dataset)
        ranges = group_ranges(dataset)
        loader = ShardLoader(dataset, rank=rank, world_size=world_size, batch_size=4, seed=0)
        start, stop = share(ROWS, world_size, rank)
        assert (loader.start, loader.stop) == (start, stop)
        overlapping = {key for key, (lo, hi) in ranges.items() if lo < stop and hi > start}
        assert set(dataset.opened) == overlapping
        assert len(dataset.opened) == len(overlapping)  # each group read once
        opened_everywhere |= set(dataset.opened)
    assert opened_everywhere == set(ranges)


def test_uint8_features_stay_uint8_and_become_floats_in_unit_range(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(30, 4, 4), dtype=np.uint8)
    pixels[0] = 255
    pixels[1] = 0
    with DatasetWriter(str(tmp_path / "pixels"), (4, 4), "uint8", row_group_size=7) as writer:
        writer.write(pixels, np.arange(30) % 2)
    dataset = open_dataset(str(tmp_path / "pixels"))
    assert feature_scale(np.uint8) == pytest.approx(1 / 255) and feature_scale(np.float32) == 1.0
    loader = ShardLoader(dataset, rank=0, world_size=1, batch_size=8, seed=0, shuffle=False)
    assert loader.features.dtype == np.uint8
    np.testing.assert_array_equal(loader.features, pixels)
    batches = list(loader.batches(0))
    inputs = torch.cat([batch for batch, _ in batches])
    assert inputs.dtype == torch.float32 and inputs.shape == (30, 4, 4)
    assert inputs.min() >= 0 and inputs.max() <= 1
    np.testing.assert_allclose(inputs.numpy(), pixels.astype(np.float32) / 255, rtol=1e-6, atol=0)
    assert loader.features.dtype == np.uint8  # conversion happened per batch, not in place
    np.testing.assert_array_equal(loader.features, pixels)


def test_sample_shape_reshapes_each_row(id_dataset):
    loader = ShardLoader(open_dataset(id_dataset), rank=0, world_size=1, batch_size=10, seed=0,
                         shuffle=False, sample_shape=[3, 1])
    inputs, _ = next(iter(loader.batches(0)))
    assert inputs.shape == (10, 3, 1)


def test_loader_refuses_more_workers_than_rows(id_dataset):
    with pytest.raises(DataError):
        ShardLoader(open_dataset(id_dataset), rank=0, world_size=ROWS + 1, batch_size=1, seed=0)
