"""A map-style Dataset whose `__getitem__` draws at random would be written with one draw for every epoch:
it is refused in one line naming the argument and the item, before any row is written; a Dataset that
gives the same item every time (a seeded draw per index among them) is written as it is."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shoal.data.in_memory import write_in_memory
from shoal.errors import EXIT_USAGE, ConfigError, ShoalError
from shoal.fit_inputs import datasets_on_disk

ROWS = 41


def message(where: str, index: int) -> str:
    return (f"{where}: the Dataset's item {index} differs between two reads (a random transform in __getitem__?): "
            "shoal writes a Dataset once, so one draw would serve every epoch; apply the random part as "
            "shoal.fit(transform=...), run on every batch every epoch")


class Items:
    """(features, label) items, or dicts of them; those at `random` indices draw fresh noise at every read."""

    def __init__(self, random=(), dicts: bool = False):
        self.random, self.dicts, self.reads = set(random), dicts, 0

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, index: int):
        self.reads += 1
        features = torch.full((4,), float(index))
        if index in self.random:
            features = features + torch.rand(4)
        return {"x": features, "label": index % 2} if self.dicts else (features, index % 2)


@pytest.mark.parametrize(("random", "index"), [((0,), 0), ((ROWS // 2,), ROWS // 2), ((ROWS - 1,), ROWS - 1),
                                               (range(ROWS), 0)])
@pytest.mark.parametrize("dicts", [False, True])
def test_a_random_getitem_is_refused_naming_the_item(tmp_path, random, index, dicts):
    data = Items(random, dicts)
    with pytest.raises(ConfigError) as refused:
        write_in_memory(data, str(tmp_path / "out"), "train")
    assert str(refused.value) == message("train", index)
    assert refused.value.exit_code == EXIT_USAGE
    assert data.reads <= 6 and not (tmp_path / "out").exists()  # refused before a row was written


def test_a_random_item_among_those_not_read_twice_is_not_seen(tmp_path):
    # a sample of three items, not a proof: the refusal is for the common case, a transform on every item
    assert write_in_memory(Items(random=(5,)), str(tmp_path / "out"), "train").rows == ROWS


class Seeded(Items):
    """A draw seeded by the index: the same item at every read, so nothing is lost by writing it once."""

    def __getitem__(self, index: int):
        features, label = super().__getitem__(index)
        noise = np.random.default_rng(index).standard_normal(4).astype(np.float32)
        return features + torch.from_numpy(noise), label


def test_a_deterministic_dataset_is_written_and_read_back(tmp_path):
    data = Seeded()
    dataset = write_in_memory(data, str(tmp_path / "out"), "train")
    features, labels = dataset.read_all()
    assert np.array_equal(features, np.stack([data[index][0].numpy() for index in range(ROWS)]))
    assert labels.tolist() == [index % 2 for index in range(ROWS)]


def test_an_item_holding_a_nan_is_the_same_at_every_read(tmp_path):
    class WithNan(Items):
        def __getitem__(self, index: int):
            features, label = super().__getitem__(index)
            return features * float("nan"), label

    # the same NaN twice is no random draw: the write itself names the non-finite row
    with pytest.raises(ShoalError, match=r"^train: row 1 \(index 0\) of the features holds a non-finite value"):
        write_in_memory(WithNan(), str(tmp_path / "out"), "train")


def test_inside_fit_the_refusal_names_the_argument():
    with pytest.raises(ConfigError) as refused, datasets_on_disk({}, (np.zeros((4, 2)), np.zeros(4)),
                                                                 Items(random=(0,)), None):
        pass
    assert str(refused.value) == message("test", 0)
