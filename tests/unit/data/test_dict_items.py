"""Dict items (as Accelerate and Lightning code holds them), written for `shoal.fit` and read back as dict
batches: each field's exact values, shape and dtype, the label under its key, the layout in meta.json for
every reader (a streamed one too), and one line naming the row and the field for an item unlike the first."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from shoal.data.compatible import TRAINING, check_compatible, schema
from shoal.data.describe import describe, render
from shoal.data.flight import DataServer, open_remote
from shoal.data.format import open_dataset
from shoal.data.in_memory import write_in_memory
from shoal.data.loader import Converter, ShardLoader, batch_rows
from shoal.errors import ConfigError, DataError

ROWS = 30
SECRET = "the job's secret"


def item(index: int) -> dict:
    """Token ids, a mask, a float image and a scalar weight, the label between them: order is the dict's."""
    return {
        "input_ids": torch.arange(5) + 100 * index,
        "attention_mask": torch.tensor([True] * (index % 5) + [False] * (5 - index % 5)),
        "label": index % 3,
        "pixels": np.arange(6, dtype=np.float64).reshape(2, 3) / 4 + index,
        "weight": 0.5 * index,
    }


class Items:
    """A map-style Dataset of dict items, each as `make(index)` makes it."""

    def __init__(self, make=item, rows: int = ROWS):
        self.make, self.rows = make, rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict:
        return self.make(index)


def batches(dataset, mode: str = "memory", **options) -> list[dict]:
    """Two epochs' batches of the whole set, the share held as `mode` says (memory, or a local cache)."""
    loader = ShardLoader(dataset, rank=0, world_size=1, batch_size=7, seed=0, shuffle=False, **options)
    try:
        assert loader.describe()["mode"] == mode
        return [batch for epoch in (0, 1) for batch in loader.batches(epoch)]
    finally:
        loader.close()


def check_rows(batch: dict, indices: list[int]) -> None:
    """Every field of `batch` holds exactly the items' values, in their shape and tensor dtype."""
    expected = [item(index) for index in indices]
    assert list(batch) == ["input_ids", "attention_mask", "pixels", "weight", "label"]
    assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].shape == (len(indices), 5)
    assert torch.equal(batch["input_ids"], torch.stack([one["input_ids"] for one in expected]))
    assert batch["attention_mask"].dtype == torch.bool
    assert torch.equal(batch["attention_mask"], torch.stack([one["attention_mask"] for one in expected]))
    assert batch["pixels"].dtype == torch.float32 and batch["pixels"].shape == (len(indices), 2, 3)
    assert torch.equal(batch["pixels"], torch.tensor(np.stack([one["pixels"] for one in expected]),
                                                     dtype=torch.float32))
    assert batch["weight"].shape == (len(indices),)
    assert batch["weight"].tolist() == [one["weight"] for one in expected]
    assert batch["label"].dtype == torch.int64 and batch["label"].tolist() == [one["label"] for one in expected]


def test_fields_come_back_as_dict_batches_with_exact_values_shapes_and_dtypes(tmp_path):
    dataset = write_in_memory(Items(), str(tmp_path / "out"), "train")
    assert dataset.fields == [{"name": "input_ids", "shape": [5], "dtype": "int64"},
                              {"name": "attention_mask", "shape": [5], "dtype": "bool"},
                              {"name": "pixels", "shape": [2, 3], "dtype": "float32"},
                              {"name": "weight", "shape": [], "dtype": "float32"}]
    assert dataset.label_key == "label" and dataset.classes == [0, 1, 2]
    assert dataset.shape == (17,) and dataset.feature_dtype == np.float32  # int64 and float64 meet as float32
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["fields"] == dataset.fields and meta["label_key"] == "label"
    read = batches(dataset)
    assert [batch_rows(batch) for batch in read] == [7, 7, 7, 7, 2] * 2
    for number, batch in enumerate(read[:5]):
        check_rows(batch, list(range(7 * number, min(7 * number + 7, ROWS))))


def test_a_cached_share_gives_the_same_dict_batches(tmp_path):
    dataset = write_in_memory(Items(), str(tmp_path / "out"), "train")
    budget = ROWS * 8 + 2 * 14 * 17 * 4  # sub-partitions of 14 rows: the share does not fit in memory
    cached = batches(dataset, "cache", memory_budget=budget, cache_dir=str(tmp_path / "cache"))
    for held, read in zip(batches(dataset), cached, strict=True):
        assert held.keys() == read.keys() and all(torch.equal(held[key], read[key]) for key in held)


def test_the_converter_gives_fields_on_their_own_without_scaling_uint8(tmp_path):
    pixels = {"image": np.full((2, 2), 255, dtype=np.uint8), "channel": np.uint8(3), "target": 1.5}
    dataset = write_in_memory(Items(lambda index: pixels), str(tmp_path / "out"), "train", label="target")
    assert dataset.feature_dtype == np.uint8 and dataset.label_key == "target"
    convert = Converter.for_dataset(dataset, label_dtype=torch.float32)
    batch = convert(*dataset.read_rows(0, 3))
    assert batch["image"].dtype == torch.int64 and batch["image"].tolist() == [[[255, 255], [255, 255]]] * 3
    assert batch["channel"].tolist() == [3, 3, 3]
    assert batch["target"].dtype == torch.float32 and batch["target"].tolist() == [1.5] * 3
    plain = Converter(np.dtype(np.uint8), (2,))  # rows of pairs are scaled to [0, 1], as before
    inputs, labels = plain(np.array([[255, 0]], dtype=np.uint8), np.array([1]))
    assert inputs.tolist() == [[1.0, 0.0]] and batch_rows((inputs, labels)) == 1


def test_a_list_of_dicts_is_read_as_items(tmp_path):
    dataset = write_in_memory([item(index) for index in range(ROWS)], str(tmp_path / "out"), "train")
    check_rows(batches(dataset)[0], list(range(7)))


def test_the_label_key_is_named_by_fit_s_label_argument(tmp_path):
    def renamed(index: int) -> dict:
        one = item(index)
        return {"labels": one.pop("label"), **one}

    with pytest.raises(ConfigError) as refused:
        write_in_memory(Items(renamed), str(tmp_path / "out"), "train")
    assert str(refused.value) == ("train: row 1 (index 0) has no label 'label'; its keys are 'labels', 'input_ids', "
                                  "'attention_mask', 'pixels', 'weight' (fit's label= names the label's key)")
    dataset = write_in_memory(Items(renamed), str(tmp_path / "out"), "train", label="labels")
    assert dataset.label_key == "labels" and [field["name"] for field in dataset.fields][0] == "input_ids"
    assert batches(dataset)[0]["labels"].tolist() == [index % 3 for index in range(7)]


def unlike(index_at: int, change) -> Items:
    """Items as `item` makes them, but for the one at `index_at`, which `change` alters."""
    def make(index: int) -> dict:
        one = item(index)
        if index == index_at:
            change(one)
        return one
    return Items(make)


@pytest.mark.parametrize(("change", "message"), [
    (lambda one: one.pop("label"), "train: row 13 (index 12) has no label 'label'; its keys are 'input_ids', "
                                   "'attention_mask', 'pixels', 'weight' (fit's label= names the label's key)"),
    (lambda one: one.update(pixels=np.zeros((3, 2))),
     "train: row 13 (index 12): field 'pixels' has shape (3, 2); row 1's has (2, 3)"),
    (lambda one: one.pop("weight"), "train: row 13 (index 12) has no field 'weight', which row 1 has (its keys: "
                                    "'input_ids', 'attention_mask', 'label', 'pixels')"),
    (lambda one: one.update(extra=1), "train: row 13 (index 12) has field 'extra', which row 1 has not"),
    (lambda one: one.update(input_ids=torch.rand(5)),
     "train: row 13 (index 12): field 'input_ids' holds float32 values; row 1's holds integers"),
    (lambda one: one.update(input_ids=torch.tensor([2**24 + 1] * 5)),
     "train: row 13 (index 12): field 'input_ids' holds 16777217, which the dataset's float32 values do not hold "
     "exactly"),
])
def test_an_item_unlike_the_first_is_named_by_its_row_and_field(tmp_path, change, message):
    with pytest.raises(ConfigError) as refused:
        write_in_memory(unlike(12, change), str(tmp_path / "out"), "train")
    assert str(refused.value) == message
    assert not (tmp_path / "out").exists()


def test_a_text_field_or_a_label_alone_is_refused(tmp_path):
    with pytest.raises(ConfigError) as refused:
        write_in_memory(Items(lambda index: {"text": "a review", **item(index)}), str(tmp_path / "out"), "train")
    assert str(refused.value) == ("train: row 1 (index 0): field 'text' holds text, not numbers: drop it from the "
                                  "items, or encode it as numbers")
    with pytest.raises(ConfigError, match=r"^train: row 1 \(index 0\) holds only the label 'label': no fields"):
        write_in_memory(Items(lambda index: {"label": 1}), str(tmp_path / "out"), "train")


def test_label_names_a_key_of_dict_items_only(tmp_path):
    with pytest.raises(ConfigError) as refused:
        write_in_memory((np.zeros((4, 2)), np.zeros(4)), str(tmp_path / "out"), "train", label="y")
    assert str(refused.value) == ("label: names a DataFrame's column or the label's key in dict items; train is a "
                                  "tuple of arrays")
    with pytest.raises(ConfigError, match=r"^label: names .*; test's items are tuples, not dicts$"):
        write_in_memory(Items(lambda index: (torch.zeros(2), 1)), str(tmp_path / "out"), "test", label="y")


def test_a_test_set_with_other_fields_is_refused(tmp_path):
    train = write_in_memory(Items(), str(tmp_path / "train"), "train")
    same = write_in_memory(Items(rows=5), str(tmp_path / "same"), "test", encoding_from=str(train.path))
    check_compatible(same, schema(train), "the training set", TRAINING)
    other = write_in_memory(Items(lambda index: {**item(index), "pixels": 1.0}), str(tmp_path / "other"), "test")
    pairs = write_in_memory((np.zeros((4, 17), np.float32), np.arange(4) % 3), str(tmp_path / "pairs"), "test")
    for test, difference in ((other, "field 'pixels' has shape [], not [2, 3]"),
                             (pairs, "its rows are (features, label) pairs, not dict items of fields 'input_ids', "
                                     "'attention_mask', 'pixels', 'weight'")):
        with pytest.raises(DataError) as refused:
            check_compatible(test, schema(train), "the training set", TRAINING)
        assert str(refused.value) == f"{test.path}: does not match the training set: {difference}"
    with pytest.raises(DataError, match="its rows are dict items of fields 'input_ids', .*, not \\(features, label"):
        check_compatible(train, schema(pairs), "the training set", TRAINING)


def test_a_plain_dataset_has_no_fields_and_its_schema_is_as_before(tmp_path):
    plain = write_in_memory((np.zeros((4, 2), np.float32), np.arange(4) % 2), str(tmp_path / "out"), "train")
    assert plain.fields is None and plain.label_key is None
    assert set(schema(plain)) == {"feature_dtype", "shape", "feature_names", "encoding", "classes"}


def test_describe_and_a_streamed_copy_read_the_fields(tmp_path):
    dataset = write_in_memory(Items(), str(tmp_path / "out"), "train")
    assert describe(dataset)["rows"] == ROWS and "sample shape [17]" in render(describe(dataset))
    assert describe(dataset)["fields"] == dataset.fields and describe(dataset)["label_key"] == "label"
    assert "\nfields: " + ", ".join(f"{field['name']} {field['shape']} {field['dtype']}" for field in dataset.fields) \
        + "; label 'label'\n" in render(describe(dataset))
    with DataServer({"/job/train": str(tmp_path / "out")}, SECRET, "127.0.0.1") as server:
        remote = open_remote(f"127.0.0.1:{server.port}", "/job/train", SECRET)
        try:
            assert remote.fields == dataset.fields and remote.label_key == "label"
            for here, there in zip(batches(dataset), batches(remote), strict=True):
                assert all(torch.equal(here[key], there[key]) for key in here)
        finally:
            remote.close()


@pytest.mark.parametrize(("fields", "message"), [
    ("x", "key 'fields': not null or a list of fields"),
    ([{"name": "a", "shape": [2], "dtype": "float64"}],
     "key 'fields': each field needs a 'name', a 'shape' of whole numbers >= 1 and a 'dtype' (float32, int64, bool) "
     "(entry 0 has not)"),
    ([{"name": "a", "shape": [1], "dtype": "int64"}, {"name": "a", "shape": [1], "dtype": "int64"}],
     "key 'fields': 'a' appears twice"),
    ([{"name": "a", "shape": [3], "dtype": "int64"}], "key 'fields': the fields hold 3 values a row; the shape, 2"),
])
def test_a_damaged_fields_key_is_named(tmp_path, fields, message):
    write_in_memory(Items(lambda index: {"a": [index, 1], "label": 0}), str(tmp_path / "out"), "train")
    meta_file = tmp_path / "out" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "fields": fields}))
    with pytest.raises(DataError) as refused:
        open_dataset(str(tmp_path / "out"))
    assert str(refused.value) == f"{meta_file}: {message}"


def test_batch_rows_counts_pairs_dicts_and_tensors():
    assert batch_rows((torch.zeros(4, 3), torch.zeros(4))) == 4
    assert batch_rows({"scalar": torch.tensor(1.0), "ids": torch.zeros(6, 2)}) == 6
    assert batch_rows(({"ids": torch.zeros(5, 2)}, torch.zeros(5))) == 5
    with pytest.raises(ValueError):
        batch_rows({"scalar": torch.tensor(1.0)})
