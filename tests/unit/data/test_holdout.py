"""Held-out rows: the seeded draw, the training rows' view of a dataset, and each trainer's validation slice."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from shoal.data import holdout
from shoal.data.cache import ShareCache
from shoal.data.format import DatasetWriter, open_dataset
from shoal.data.holdout import TrainingRows, held_out_count, held_out_rows, read_ranges, validation_rows
from shoal.data.in_memory import write_in_memory
from shoal.data.loader import ShardLoader
from shoal.errors import ConfigError

ROWS = 100


@pytest.fixture(scope="module")
def numbered(tmp_path_factory) -> str:
    """A dataset whose only feature is the row's number, labelled by text ("c0", "c1", "c2"), in files of
    23 rows and row groups of 7: a read tells which rows it holds, and raw labels differ from classes."""
    path = tmp_path_factory.mktemp("holdout") / "numbered"
    with DatasetWriter(str(path), (1,), np.int32, row_group_size=7, rows_per_file=23) as writer:
        writer.write(np.arange(ROWS, dtype=np.int32).reshape(ROWS, 1), np.array([f"c{row % 3}" for row in
                                                                                  range(ROWS)]))
    return str(path)


@pytest.fixture
def small_reads(monkeypatch):
    """Reads of 3 stored rows at a time (12 bytes of int32), so that ranges cross many of them."""
    monkeypatch.setattr(holdout, "READ_BYTES", 12)


def kept(held: np.ndarray, rows: int = ROWS) -> np.ndarray:
    return np.delete(np.arange(rows), held)


@pytest.mark.parametrize("rows, split, count", [(100, 0.1, 10), (100, 0.0, 0), (1000, 0.0001, 1), (7, 0.5, 4),
                                                (5, 0.5, 2), (3, 0.5, 2), (60_000, 0.15, 9000)])
def test_exactly_round_split_times_rows_are_held_out_at_least_one(rows, split, count):
    held = held_out_rows(rows, split, seed=4)
    assert held_out_count(rows, split) == count == len(held)
    assert held.dtype == np.int64 and np.all(np.diff(held) > 0) and (not count or 0 <= held[0] <= held[-1] < rows)


def test_the_same_seed_holds_out_the_same_rows_and_another_seed_others():
    assert np.array_equal(held_out_rows(10_000, 0.2, 7), held_out_rows(10_000, 0.2, 7))
    assert not np.array_equal(held_out_rows(10_000, 0.2, 7), held_out_rows(10_000, 0.2, 8))


def test_the_draw_in_blocks_is_exact_and_uniform(monkeypatch):
    """Blocks of 8 rows: the count per block is drawn as a draw from all rows would give it, so every row is
    held out about as often as any other."""
    monkeypatch.setattr(holdout, "DRAW_BLOCK_ROWS", 8)
    chosen = Counter()
    for seed in range(2000):
        held = held_out_rows(43, 0.25, seed)
        assert len(held) == 11 and len(set(held.tolist())) == 11 and held[-1] < 43
        chosen.update(held.tolist())
    shares = np.array([chosen[row] / 2000 for row in range(43)])
    assert np.all(np.abs(shares - 11 / 43) < 0.04)


@pytest.mark.parametrize("split", [1, 1.0, -0.1, math.nan, "0.1", True, None])
def test_a_split_that_is_no_share_is_one_line_naming_the_key(split):
    with pytest.raises(ConfigError, match=r"^train.validation_split: must be a share from 0 to below 1, got "):
        held_out_rows(100, split, 0)


@pytest.mark.parametrize("rows, split", [(1, 0.5), (1, 0.01), (4, 0.9), (0, 0.0)])
def test_a_split_leaving_no_training_row_is_one_line_naming_the_key(rows, split):
    with pytest.raises(ConfigError, match=r"^train.validation_split: .* leaving no row to train on") as caught:
        held_out_rows(rows, split, 0)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("bounds", [(0, 90), (0, 1), (89, 90), (5, 6), (3, 40), (20, 27), (22, 24), (44, 89),
                                    (0, 0), (90, 90), (17, 17)])
def test_the_view_reads_the_training_rows_in_order(numbered, small_reads, bounds):
    dataset = open_dataset(numbered)
    held = held_out_rows(ROWS, 0.1, 3)
    view = TrainingRows(dataset, held)
    start, stop = bounds
    features, labels = view.read_rows(start, stop)
    expected = kept(held)[start:stop]
    assert view.rows == 90 and features.shape == (stop - start, 1) and features.dtype == np.int32
    assert np.array_equal(features[:, 0], expected)
    assert np.array_equal(labels, expected % 3) and labels.dtype == np.int64


def test_held_out_runs_across_files_and_reads_are_skipped(numbered, small_reads):
    """Runs of held-out rows at the start, the end, across a file's and a read's boundary."""
    held = np.array([0, 1, 2, 21, 22, 23, 24, 25, 50, 97, 98, 99])
    view = TrainingRows(open_dataset(numbered), held)
    for start in range(0, view.rows, 5):
        for stop in (start, start + 1, start + 7, view.rows):
            stop = min(stop, view.rows)
            assert np.array_equal(view.read_rows(start, stop)[0][:, 0], kept(held)[start:stop])
    assert np.array_equal(view.read_all()[0][:, 0], kept(held))


def test_pieces_are_at_most_the_rows_asked_and_give_raw_labels(numbered):
    held = held_out_rows(ROWS, 0.3, 1)
    view = TrainingRows(open_dataset(numbered), held)
    pieces = list(view.iter_rows(4, 60, max_rows=5, finite=True))
    assert all(0 < len(block) <= 5 for _, block, _ in pieces)
    positions = [position for position, _, _ in pieces]
    assert positions == list(np.cumsum([0] + [len(block) for _, block, _ in pieces[:-1]]))
    assert np.array_equal(np.concatenate([block[:, 0] for _, block, _ in pieces]), kept(held)[4:60])
    assert [str(label) for _, _, labels in pieces for label in labels] == [f"c{row % 3}" for row in
                                                                         kept(held)[4:60]]


def test_a_range_without_held_out_rows_is_the_dataset_own_read(numbered):
    dataset = open_dataset(numbered)
    view = TrainingRows(dataset, np.array([50]))
    dataset.opened.clear()
    assert np.array_equal(view.read_rows(0, 30)[0][:, 0], np.arange(30))
    direct = list(dataset.opened)
    dataset.opened.clear()
    dataset.read_rows(0, 30)
    assert direct == dataset.opened


def test_everything_else_is_the_dataset_own(numbered):
    dataset = open_dataset(numbered)
    view = TrainingRows(dataset, held_out_rows(ROWS, 0.1, 0))
    assert (view.shape, view.features, view.feature_dtype, view.path) == (dataset.shape, dataset.features,
                                                                          dataset.feature_dtype, dataset.path)
    assert (view.classes, view.num_classes, view.labeled) == (["c0", "c1", "c2"], 3, True)
    assert view.schema_key() == dataset.schema_key()
    assert np.array_equal(view.label_indices(np.array(["c2", "c0"]), "here"), [2, 0])
    assert getattr(view, "bytes_received", 0) == 0  # what a streamed dataset has, a local one lacks
    assert "90 of 100 rows" in repr(view)


def test_the_fingerprint_tells_the_held_out_rows(numbered):
    dataset = open_dataset(numbered)
    same = TrainingRows(dataset, held_out_rows(ROWS, 0.1, 0)).fingerprint()
    assert same == TrainingRows(dataset, held_out_rows(ROWS, 0.1, 0)).fingerprint()
    assert same != TrainingRows(dataset, held_out_rows(ROWS, 0.1, 1)).fingerprint() != dataset.fingerprint()
    assert TrainingRows(dataset, held_out_rows(ROWS, 0.0, 1)).fingerprint() == dataset.fingerprint()


@pytest.mark.parametrize("held", [[5, 3], [3, 3], [-1], [100], [[1, 2]]])
def test_held_out_rows_that_are_no_sorted_rows_of_the_dataset_are_refused(numbered, held):
    with pytest.raises(ValueError, match="sorted, distinct rows of 0..99"):
        TrainingRows(open_dataset(numbered), np.array(held))


def test_a_range_outside_the_training_rows_is_refused(numbered):
    view = TrainingRows(open_dataset(numbered), held_out_rows(ROWS, 0.1, 0))
    with pytest.raises(ValueError, match=r"outside 0..90"):
        view.read_rows(80, 91)


@pytest.mark.parametrize("trainers", [1, 2, 3, 7, 15])
def test_the_trainers_validation_slices_partition_the_held_out_rows(numbered, small_reads, trainers):
    dataset = open_dataset(numbered)
    held = held_out_rows(ROWS, 0.1, 9)
    slices = [validation_rows(dataset, held, trainer, trainers) for trainer in range(trainers)]
    for (features, labels), expected in zip(slices, np.array_split(held, trainers), strict=True):
        assert features.shape == (len(expected), 1) and features.dtype == np.int32
        assert np.array_equal(features[:, 0], expected) and np.array_equal(labels, expected % 3)
    assert np.array_equal(np.concatenate([features[:, 0] for features, _ in slices]), held)


def test_a_trainer_outside_the_trainers_is_refused(numbered):
    with pytest.raises(ValueError, match="trainer 3 outside 0..2"):
        validation_rows(open_dataset(numbered), np.array([1, 2]), 3, 3)


def test_reads_span_short_gaps_and_stop_at_long_ones():
    rows = np.array([3, 4, 6, 10, 11, 30])
    assert read_ranges(rows, 1) == [(3, 7), (10, 12), (30, 31)]
    assert read_ranges(rows, 3) == [(3, 12), (30, 31)]
    assert read_ranges(rows, 100) == [(3, 31)]
    assert read_ranges(np.array([], np.int64), 3) == []


def test_a_dataset_written_from_memory_holds_out_rows_of_floats(tmp_path):
    """A regression dataset from arrays: raw labels are the targets, features are whole rows."""
    features = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    dataset = write_in_memory((features, np.linspace(0.5, 9.5, 40)), str(tmp_path / "floats"), "data")
    held = held_out_rows(40, 0.25, 2)
    train_features, targets = TrainingRows(dataset, held).read_all()
    assert np.array_equal(train_features, np.delete(features, held, axis=0))
    assert np.allclose(targets, np.delete(np.linspace(0.5, 9.5, 40), held)) and targets.dtype == np.float32
    validation = validation_rows(dataset, held, 0, 1)
    assert np.array_equal(validation[0], features[held])


def loaded_rows(loader: ShardLoader, epoch: int = 0) -> list[int]:
    return [int(value) for inputs, _ in loader.batches(epoch) for value in inputs.reshape(-1).tolist()]


@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("keep_cache", [False, True])
def test_the_loader_over_the_view_serves_exactly_the_training_rows(numbered, tmp_path, world_size, cached,
                                                                   keep_cache):
    """Without a budget each share is read into memory; with one below a share's 12 bytes a row (its
    labels' 8 and sub-partitions of two batches), each is copied to a local cache through the view."""
    held = held_out_rows(ROWS, 0.2, 6)
    view = TrainingRows(open_dataset(numbered), held)
    cache_dir = str(tmp_path / "cache") if keep_cache else None
    budget = -(-view.rows // world_size) * 8 + 2 * 8 * 4 if cached else None
    seen, labels = [], []
    for rank in range(world_size):
        loader = ShardLoader(view, rank=rank, world_size=world_size, batch_size=4, seed=1, shuffle=False,
                             memory_budget=budget, cache_dir=cache_dir)
        assert (loader.cache is not None) == (budget is not None)
        seen += loaded_rows(loader)
        labels += [int(value) for _, targets in loader.batches(1) for value in targets.tolist()]
        loader.close()
    assert seen == kept(held).tolist() and labels == (kept(held) % 3).tolist()


def test_the_shuffled_loader_over_the_view_serves_each_training_row_once(numbered):
    held = held_out_rows(ROWS, 0.2, 6)
    view = TrainingRows(open_dataset(numbered), held)
    loaders = [ShardLoader(view, rank=rank, world_size=2, batch_size=5, seed=2, memory_budget=budget)
               for rank, budget in ((0, None), (1, 400))]
    assert loaders[0].cache is None and loaders[1].cache is not None
    assert Counter(loaded_rows(loaders[0], 3) + loaded_rows(loaders[1], 3)) == Counter(kept(held).tolist())
    for loader in loaders:
        loader.close()


def test_a_kept_cache_of_the_dataset_rows_is_not_taken_for_the_view(numbered, tmp_path):
    """A cache folder holds the whole dataset's rows 0..80 from an earlier run without a split: the view's
    rows 0..80 are others, so its cache is written anew, and a later run with the same split reuses it."""
    dataset, cache_dir = open_dataset(numbered), str(tmp_path / "cache")
    plain = ShareCache(dataset, 0, 80, cache_dir=cache_dir, chunk_rows=6)
    plain.close()
    held = held_out_rows(ROWS, 0.2, 6)
    first = ShareCache(TrainingRows(dataset, held), 0, 80, cache_dir=cache_dir, chunk_rows=6)
    assert not first.reused and np.array_equal(first.features[:, 0], kept(held))
    first.close()
    again = ShareCache(TrainingRows(open_dataset(numbered), held_out_rows(ROWS, 0.2, 6)), 0, 80,
                       cache_dir=cache_dir, chunk_rows=6)
    assert again.reused and np.array_equal(again.features[:, 0], kept(held))
    assert np.array_equal(again.labels, kept(held) % 3)
    again.close()


def test_the_held_out_rows_do_not_depend_on_the_workers(numbered):
    """A job resumed on another number of workers trains on the same rows: together, its shares are the
    same training rows."""
    view = TrainingRows(open_dataset(numbered), held_out_rows(ROWS, 0.1, 5))
    for world_size in (2, 4):
        shares = []
        for rank in range(world_size):
            loader = ShardLoader(view, rank=rank, world_size=world_size, batch_size=3, seed=0, shuffle=False)
            shares += loaded_rows(loader)
            loader.close()
        assert shares == kept(held_out_rows(ROWS, 0.1, 5)).tolist()


class DictItems:
    """A map-style set of dict items whose field `row` is the item's index."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> dict:
        return {"row": np.array([float(index)]), "label": index % 3}


@pytest.mark.parametrize("budget", [None, 20 * 8 + 2 * 4 * 8])
def test_the_view_of_dict_items_gives_dict_batches_of_the_training_rows(tmp_path, budget):
    """The view's fields and label key are the dataset's, so the loader makes the same dict batches."""
    dataset = write_in_memory(DictItems(), str(tmp_path / "items"), "data")
    held = held_out_rows(40, 0.5, 1)
    loader = ShardLoader(TrainingRows(dataset, held), rank=0, world_size=1, batch_size=4, seed=0, shuffle=False,
                         memory_budget=budget)
    assert (loader.cache is not None) == (budget is not None)
    batches = list(loader.batches(0))
    loader.close()
    assert all(set(batch) == {"row", "label"} for batch in batches)
    rows = torch.cat([batch["row"].reshape(-1) for batch in batches]).to(torch.int64)
    assert rows.tolist() == kept(held, 40).tolist()
    assert torch.cat([batch["label"] for batch in batches]).tolist() == (kept(held, 40) % 3).tolist()
