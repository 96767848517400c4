"""A damaged meta.json: every bad field is one line naming the file and the key, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shoal.cli import main
from shoal.data.format import META_FILE, DatasetWriter, open_dataset
from shoal.errors import DataError


@pytest.fixture
def dataset(tmp_path) -> Path:
    path = tmp_path / "set"
    with DatasetWriter(str(path), (2, 2), "float32", rows_per_file=6, row_group_size=3,
                       feature_names=["a", "b", "c", "d"]) as writer:
        writer.write(np.arange(40, dtype=np.float32).reshape(10, 2, 2), np.arange(10) % 3)
    return path


def edit(path: Path, change) -> None:
    meta = json.loads((path / META_FILE).read_text())
    change(meta)
    (path / META_FILE).write_text(json.dumps(meta))


def refusal(path: Path) -> str:
    with pytest.raises(DataError) as caught:
        open_dataset(str(path))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}/{META_FILE}: ")
    return message


@pytest.mark.parametrize("dtype", ["float99", "str", "U10", "object", "complex64", "datetime64[s]", "f4,i4",
                                   "(2,)f4", "float128", ""])
def test_a_feature_dtype_that_is_not_a_number_type_names_the_key(dataset, dtype):
    edit(dataset, lambda meta: meta.update(feature_dtype=dtype))
    assert f"key 'feature_dtype': {dtype!r} is not a number type" in refusal(dataset)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int64", "uint8", "bool", "<f4"])
def test_number_dtypes_are_accepted(dataset, dtype):
    edit(dataset, lambda meta: meta.update(feature_dtype=dtype))
    assert open_dataset(str(dataset)).feature_dtype == np.dtype(dtype)


@pytest.mark.parametrize(("change", "named"), [
    (lambda meta: meta.update(feature_dtype=32), "key 'feature_dtype' missing or not a str"),
    (lambda meta: meta.update(rows=True), "key 'rows' missing or not a int"),
    (lambda meta: meta.update(rows="10"), "key 'rows' missing or not a int"),
    (lambda meta: meta.update(shape=["2", 2]), "key 'shape': ['2', 2] is not a list of whole numbers >= 1"),
    (lambda meta: meta.update(shape=[2, 0]), "key 'shape'"),
    (lambda meta: meta.update(shape=[2, 2.5]), "key 'shape'"),
    (lambda meta: meta.update(version="2"), "unsupported format version '2'"),
    (lambda meta: meta["files"].append("part-00009.parquet"), "key 'files': each file entry needs"),
    (lambda meta: meta["files"][0].update(rows="6"), "key 'files': each file entry needs"),
    (lambda meta: meta["files"][0].update(row_groups=["3", "3"]), "key 'files': the rows of 'part-00000.parquet'"),
    (lambda meta: meta["files"][0].update(row_groups=[None, 6]), "key 'files': the rows of 'part-00000.parquet'"),
    (lambda meta: meta["files"][0].update(name="../elsewhere.parquet"), "key 'files': '../elsewhere.parquet' is not"),
    (lambda meta: meta["files"][0].update(name=""), "key 'files': '' is not the name of a file"),
    (lambda meta: meta.update(classes=[2, 1, 0]), "key 'classes': not sorted, or a label appears twice"),
    (lambda meta: meta.update(classes=[0, 0, 1]), "key 'classes': not sorted, or a label appears twice"),
    (lambda meta: meta.update(classes=[0, "a"]), "key 'classes': mixes text and numbers"),
    (lambda meta: meta.update(classes=[[0], [1]]), "key 'classes': not null or a list of labels"),
    (lambda meta: meta.update(classes={"0": 0}), "key 'classes': not null or a list of labels"),
    (lambda meta: meta.update(classes=[]), "key 'classes': not null or a list of labels"),
    (lambda meta: meta.update(feature_names=["a", "b"]), "key 'feature_names': 2 names for 4 features"),
    (lambda meta: meta.update(feature_names=[1, 2, 3, 4]), "key 'feature_names': not null or a list of names"),
])
def test_a_bad_field_is_one_line_naming_the_key(dataset, change, named):
    edit(dataset, change)
    assert named in refusal(dataset)


def test_the_command_line_says_it_in_one_line_and_exits_2(dataset, capsys):
    edit(dataset, lambda meta: meta.update(feature_dtype="float99"))
    assert main(["data", "describe", str(dataset)]) == 2
    error = capsys.readouterr().err
    assert error == f"shoal: error: {dataset}/{META_FILE}: key 'feature_dtype': 'float99' is not a number type " \
                    "(such as float32, float64, int64 or uint8)\n"


def test_an_intact_meta_still_opens_with_every_field(dataset):
    opened = open_dataset(str(dataset))
    assert opened.shape == (2, 2) and opened.classes == [0, 1, 2] and opened.feature_names == ["a", "b", "c", "d"]
    np.testing.assert_array_equal(opened.read_all()[0][9], [[36, 37], [38, 39]])
