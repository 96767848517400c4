"""Iterables for `shoal.fit` (a torch IterableDataset, a generator of items): streamed once into a dataset,
a chunk at a time, with a warning that a random transform in them is drawn once; an empty one is one line."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from shoal.data import in_memory
from shoal.data.in_memory import write_in_memory
from shoal.data.loader import ShardLoader
from shoal.errors import ConfigError

ROWS, CHUNK = 23, 5  # five chunks, the last of three rows


def warning_for(where: str, rows: int) -> str:
    return (f"{where}: an iterable dataset is read once, into a dataset every epoch reads again ({rows} rows): "
            "a random transform in it is drawn once; give it as shoal.fit(transform=...) to apply it every epoch")


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(in_memory, "CHUNK_ROWS", CHUNK)


def written(data, path, where: str = "train", **options):
    """The dataset `data` makes, and the warnings its writing gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = write_in_memory(data, str(path), where, **options)
    return dataset, [str(warning.message) for warning in caught]


def test_a_generator_of_pairs_is_streamed_chunk_by_chunk_and_read_back_exactly(tmp_path, monkeypatch):
    pulled, writes = [], []
    write = in_memory.DatasetWriter.write

    def watched(writer, features, labels=None):  # each chunk is written before the next is pulled
        writes.append((len(features), len(pulled)))
        write(writer, features, labels)

    monkeypatch.setattr(in_memory.DatasetWriter, "write", watched)

    def pairs():
        for index in range(ROWS):
            pulled.append(index)
            yield np.array([index, -index, 0.25 * index]), index % 4

    dataset, said = written(pairs(), tmp_path / "out")
    assert said == [warning_for("train", ROWS)]
    assert pulled == list(range(ROWS)) and dataset.rows == ROWS and dataset.fields is None
    assert writes == [(5, 5), (5, 10), (5, 15), (5, 20), (3, 23)]
    features, labels = dataset.read_all()
    assert features.tolist() == [[index, -index, 0.25 * index] for index in range(ROWS)]
    assert labels.tolist() == [index % 4 for index in range(ROWS)]


def test_items_are_read_a_chunk_at_a_time(tmp_path):
    """A row unlike the others is named among its chunk's rows: the chunks are CHUNK rows each."""
    def ragged():
        for index in range(ROWS):
            yield torch.zeros(2 if index == 12 else 3), 0

    with pytest.raises(ConfigError, match=r"^train: rows 11 to 15 \(indices 10 to 14\) differ in shape"):
        written(ragged(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


class Stream(IterableDataset):
    """A torch IterableDataset of dict items; its length does not make it map-style."""

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, index):  # torch's Dataset declares it; an IterableDataset is still read by iterating
        raise NotImplementedError

    def __iter__(self):
        for index in range(ROWS):
            yield {"ids": torch.tensor([index, index + 1]), "scale": torch.tensor(index / 2), "label": index % 2}


def test_an_iterable_dataset_of_dicts_becomes_dict_batches(tmp_path):
    dataset, said = written(Stream(), tmp_path / "out", "test")
    assert said == [warning_for("test", ROWS)]
    assert dataset.fields == [{"name": "ids", "shape": [2], "dtype": "int64"},
                              {"name": "scale", "shape": [], "dtype": "float32"}]
    loader = ShardLoader(dataset, rank=0, world_size=1, batch_size=ROWS, seed=0, shuffle=False)
    (batch,) = list(loader.batches(0))
    loader.close()
    assert batch["ids"].tolist() == [[index, index + 1] for index in range(ROWS)]
    assert batch["scale"].tolist() == [index / 2 for index in range(ROWS)]
    assert batch["label"].tolist() == [index % 2 for index in range(ROWS)]


def test_an_empty_iterable_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as refused:
        written(iter([]), tmp_path / "out")
    assert str(refused.value) == "train: the iterable (list_iterator) yields no items"
    assert not (tmp_path / "out").exists()


def test_an_odd_item_in_a_stream_is_named_by_its_row_from_one(tmp_path):
    items = (({"x": 1.0, "label": 0} if index != 8 else [1.0, 0]) for index in range(ROWS))
    with pytest.raises(ConfigError) as refused:
        written(items, tmp_path / "out")
    assert str(refused.value) == "train: row 9 (index 8) is a list, not a dict as row 1 is"


def test_a_data_loader_is_refused_for_its_dataset(tmp_path):
    loader = DataLoader([(torch.zeros(3), 0)] * 4, batch_size=2)
    with pytest.raises(ConfigError) as refused:
        written(loader, tmp_path / "out")
    assert str(refused.value) == ("train: a DataLoader yields batches, not items: give its dataset "
                                  "(train=loader.dataset); shoal makes the batches itself (batch_size)")
