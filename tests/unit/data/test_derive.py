"""Describing, splitting and under-sampling datasets: exact counts, all-or-nothing outputs, streaming reads."""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shoal.cli import main
from shoal.data.derive import sample, split, subset
from shoal.data.describe import describe
from shoal.data.format import DatasetWriter, open_dataset
from shoal.errors import DataError

PROVENANCE = {"source": {"format": "csv", "path": "/data/claims.csv"}, "encoding": {"state": ["CA", "NY"]}}


def write_dataset(path: Path, labels, *, row_group_size: int = 16, rows_per_file: int = 64, width: int = 3,
                  dtype: str = "float64", extra_meta: dict | None = None) -> Path:
    """Rows whose feature 0 is the row's number, so every row can be told apart after a shuffle."""
    labels = np.asarray(labels)
    features = np.random.default_rng(7).normal(size=(len(labels), width)).astype(dtype)
    features[:, 0] = np.arange(len(labels))
    with DatasetWriter(str(path), (width,), dtype, row_group_size=row_group_size, rows_per_file=rows_per_file,
                       feature_names=[f"f{index}" for index in range(width)],
                       extra_meta=PROVENANCE if extra_meta is None else extra_meta) as writer:
        writer.write(features, labels)
    return path


def rows_of(path) -> tuple[np.ndarray, list]:
    """Row numbers (feature 0) and raw labels of a dataset."""
    dataset = open_dataset(str(path))
    features, indices = dataset.read_all()
    return features[:, 0].astype(np.int64), [dataset.classes[index] for index in indices]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def animals(tmp_path) -> tuple[Path, np.ndarray]:
    """200 rows of three unevenly common string classes, in 4 files of 16-row groups."""
    labels = np.random.default_rng(3).choice(np.array(["ant", "bee", "cat"]), size=200, p=[0.6, 0.3, 0.1])
    return write_dataset(tmp_path / "animals", labels), labels


@pytest.fixture
def claims(tmp_path) -> tuple[Path, np.ndarray]:
    """A binary set, 30 rows of class 1 among 400."""
    labels = np.zeros(400, dtype=np.int64)
    labels[np.random.default_rng(5).choice(400, size=30, replace=False)] = 1
    return write_dataset(tmp_path / "claims", labels, row_group_size=50, rows_per_file=150), labels


# ---------------------------------------------------------------- describe


def test_describe_counts_rows_classes_files_and_bytes(animals):
    path, labels = animals
    description = describe(path)
    expected = collections.Counter(labels.tolist())
    assert description["rows"] == 200 and description["shape"] == [3] and description["features"] == 3
    assert description["feature_dtype"] == "float64" and description["feature_names"] == ["f0", "f1", "f2"]
    assert description["classes"] == ["ant", "bee", "cat"]
    assert description["class_counts"] == {label: expected[label] for label in ["ant", "bee", "cat"]}
    assert [(f["name"], f["rows"], f["row_groups"]) for f in description["files"]] == [
        ("part-00000.parquet", 64, 4), ("part-00001.parquet", 64, 4), ("part-00002.parquet", 64, 4),
        ("part-00003.parquet", 8, 1)]
    for entry in description["files"]:
        assert entry["bytes"] == os.path.getsize(path / entry["name"])
    assert description["bytes"] == sum(os.path.getsize(path / name) for name in os.listdir(path))
    assert description["source"] == PROVENANCE["source"] and description["encoding"] == PROVENANCE["encoding"]
    assert description["derived"] is None and description["target"] is None


def test_describe_through_a_filesystem_uri(animals):
    path, _ = animals
    local, remote = describe(path), describe(path.as_uri())
    assert remote["path"] == path.as_uri()
    assert {**remote, "path": None} == {**local, "path": None}


def test_describe_a_regression_target(tmp_path):
    targets = np.random.default_rng(1).normal(size=50) + 0.5
    path = write_dataset(tmp_path / "reg", targets, extra_meta={})
    description = describe(path)
    assert description["classes"] is None and description["class_counts"] is None and description["source"] is None
    assert description["target"]["min"] == targets.min() and description["target"]["max"] == targets.max()
    assert math.isclose(description["target"]["mean"], targets.mean())


def test_describe_command_prints_counts_and_json(animals, capsys):
    path, labels = animals
    status, out, _ = run(["data", "describe", str(path)], capsys)
    assert status == 0
    count = collections.Counter(labels.tolist())["bee"]
    assert f"bee  {count:>12,}" in out and "200 rows" in out and "files: 4" in out and '"CA"' in out
    status, out, _ = run(["data", "describe", str(path), "--json"], capsys)
    assert status == 0 and json.loads(out)["class_counts"]["cat"] == collections.Counter(labels.tolist())["cat"]


# ---------------------------------------------------------------- split


def test_split_is_exact_disjoint_and_complete(animals, tmp_path):
    path, labels = animals
    train, test = split(path, test=0.3, seed=1, train_out=tmp_path / "a", test_out=tmp_path / "b")
    assert (train.rows, test.rows) == (140, 60)
    train_ids, train_labels = rows_of(train.path)
    test_ids, test_labels = rows_of(test.path)
    assert set(train_ids.tolist()).isdisjoint(test_ids.tolist())
    assert sorted([*train_ids.tolist(), *test_ids.tolist()]) == list(range(200))
    assert train_labels == labels[train_ids].tolist() and test_labels == labels[test_ids].tolist()
    for derived in (train, test):  # the parent's schema and provenance carry over
        assert derived.schema_key() == open_dataset(str(path)).schema_key()
        assert derived.feature_names == ["f0", "f1", "f2"]
        assert derived.meta["source"] == PROVENANCE["source"] and derived.meta["encoding"] == PROVENANCE["encoding"]
        assert derived.meta["derived"][-1]["from"] == str(path)
    assert [train.meta["derived"][-1]["side"], test.meta["derived"][-1]["side"]] == ["train", "test"]


def test_split_defaults_beside_the_dataset(animals):
    path, _ = animals
    train, test = split(path, test="0.25")
    assert (train.path, test.path) == (f"{path}-train", f"{path}-test")
    assert (train.rows, test.rows) == (150, 50)


def test_stratified_split_keeps_each_class_proportion(animals, tmp_path):
    path, labels = animals
    _, test = split(path, test=0.3, stratify=True, seed=2, train_out=tmp_path / "a", test_out=tmp_path / "b")
    assert test.rows == round(0.3 * 200)
    total = collections.Counter(labels.tolist())
    tested = collections.Counter(rows_of(test.path)[1])
    for label in total:
        assert abs(tested[label] - 0.3 * total[label]) < 1


def test_a_class_absent_from_one_side_stays_in_its_classes(tmp_path):
    # 50 a, 49 b, 1 c at 10%: a gives 5, b 4.9 -> 5, c 0.1 -> 0; the test set holds no c.
    path = write_dataset(tmp_path / "rare", ["a"] * 50 + ["b"] * 49 + ["c"], row_group_size=10)
    train, test = split(path, test=0.1, stratify=True, train_out=tmp_path / "a", test_out=tmp_path / "b")
    assert collections.Counter(rows_of(test.path)[1]) == {"a": 5, "b": 5}
    assert train.classes == test.classes == ["a", "b", "c"]


def test_split_is_seeded(animals, tmp_path):
    path, _ = animals
    runs = {}
    for name, seed in [("first", 4), ("again", 4), ("other", 5)]:
        _, test = split(path, test=0.2, seed=seed, train_out=tmp_path / f"{name}-a", test_out=tmp_path / f"{name}-b")
        runs[name] = rows_of(test.path)[0].tolist()
    assert runs["first"] == runs["again"] and runs["first"] != runs["other"]


def test_split_of_a_regression_target(tmp_path):
    targets = np.arange(40) + 0.5
    path = write_dataset(tmp_path / "reg", targets, row_group_size=8)
    train, test = split(path, test=0.25, train_out=tmp_path / "a", test_out=tmp_path / "b")
    assert train.classes is None and test.classes is None and (train.rows, test.rows) == (30, 10)
    features, values = test.read_all()
    np.testing.assert_array_equal(values, targets[features[:, 0].astype(np.int64)])


# ---------------------------------------------------------------- under-sampling


def test_sample_keeps_every_minority_row_and_ratio_times_majority(claims, tmp_path):
    path, labels = claims
    sampled = sample(path, tmp_path / "out", ratio="1:4", seed=1)
    ids, kept = rows_of(sampled.path)
    assert sampled.rows == 30 + 4 * 30 and collections.Counter(kept) == {1: 30, 0: 120}
    assert set(np.flatnonzero(labels == 1).tolist()) <= set(ids.tolist())
    assert kept == labels[ids].tolist() and list(ids) == sorted(ids)  # input order kept
    assert sampled.classes == [0, 1] and sampled.meta["encoding"] == PROVENANCE["encoding"]
    again = sample(path, tmp_path / "again", ratio=4, seed=1)
    other = sample(path, tmp_path / "other", ratio="1:4", seed=2)
    assert rows_of(again.path)[0].tolist() == ids.tolist() != rows_of(other.path)[0].tolist()


def test_sample_with_three_classes_draws_the_majority_from_the_others(animals, tmp_path):
    path, labels = animals
    counts = collections.Counter(labels.tolist())
    sampled = sample(path, tmp_path / "out", ratio="2:5")  # 2.5 majority rows per minority row
    kept = collections.Counter(rows_of(sampled.path)[1])
    assert kept["cat"] == counts["cat"] and kept["ant"] + kept["bee"] == math.floor(2.5 * counts["cat"] + 0.5)
    named = sample(path, tmp_path / "named", ratio="1:1", minority="bee")
    assert collections.Counter(rows_of(named.path)[1])["bee"] == counts["bee"] and named.rows == 2 * counts["bee"]


def test_sample_names_an_int_minority_by_its_text(claims, tmp_path, capsys):
    path, _ = claims
    status, _, err = run(["data", "sample", str(path), "--ratio", "1:2", "--minority", "0", "--out",
                          str(tmp_path / "out")], capsys)
    assert status == 2 and "needs 740 majority rows for the 370 rows of class 0" in err
    status, out, _ = run(["data", "sample", str(path), "--ratio", "37:1", "--minority", "0", "--out",
                          str(tmp_path / "out")], capsys)
    assert status == 0 and "380 rows: 370 of class 0 and 10 of the others" in out


def test_sample_refuses_when_the_majority_is_too_small(claims, tmp_path):
    path, _ = claims
    with pytest.raises(DataError) as caught:
        sample(path, tmp_path / "out", ratio="1:13")
    assert str(caught.value) == (f"{path}: ratio 1:13 needs 390 majority rows for the 30 rows of class 1, "
                                 "but the other classes hold only 370")
    assert sorted(os.listdir(tmp_path)) == ["claims"]


def test_subset_draws_exactly_n_rows_keeping_each_class_in_proportion(animals, tmp_path, capsys):
    path, labels = animals
    counts = collections.Counter(labels.tolist())
    taken = subset(path, tmp_path / "out", rows=50, seed=4)
    ids, kept = rows_of(taken.path)
    assert taken.rows == 50 and len(set(ids.tolist())) == 50 and kept == labels[ids].tolist()
    for label, count in collections.Counter(kept).items():  # floor or ceil of a quarter of each class
        assert abs(count - counts[label] / 4) < 1
    assert taken.classes == ["ant", "bee", "cat"] and taken.meta["derived"][-1]["operation"] == "subset"
    assert rows_of(subset(path, tmp_path / "again", rows=50, seed=4).path)[0].tolist() == ids.tolist()
    status, out, _ = run(["data", "sample", str(path), "--rows", "20", "--out", str(tmp_path / "cli")], capsys)
    assert status == 0 and open_dataset(str(tmp_path / "cli")).rows == 20 and "20 rows drawn" in out
    for rows in ("0", "200"):
        status, _, err = run(["data", "sample", str(path), "--rows", rows, "--out", str(tmp_path / "bad")], capsys)
        assert status == 2 and f"{path}: a subset needs between 1 and 199 rows" in err and err.count("\n") == 1
    assert not (tmp_path / "bad").exists()


# ---------------------------------------------------------------- errors through the command line


@pytest.mark.parametrize(("ratio", "culprit"), [
    ("x", "--ratio 'x'"), ("1:", "--ratio '1:'"), (":5", "--ratio ':5'"), ("1:0", "--ratio '1:0'"),
    ("0:5", "--ratio '0:5'"), ("-1:3", "--ratio '-1:3'"), ("1:2:3", "--ratio '1:2:3'"), ("", "--ratio ''"),
    ("1:nan", "--ratio '1:nan'"), ("1:13", "needs 390 majority rows"), ("1:0.001", "gives no majority rows"),
])
def test_bad_sample_requests_exit_2_and_leave_nothing(claims, tmp_path, capsys, ratio, culprit):
    path, _ = claims
    status, _, err = run(["data", "sample", str(path), f"--ratio={ratio}", "--out", str(tmp_path / "out")], capsys)
    assert status == 2 and err.startswith(f"shoal: error: {path}: ") and culprit in err and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == ["claims"]


def test_sample_errors_about_classes(tmp_path, capsys):
    even = write_dataset(tmp_path / "even", [0, 1] * 10)
    status, _, err = run(["data", "sample", str(even), "--ratio", "1:1", "--out", str(tmp_path / "o")], capsys)
    assert status == 2 and "classes 0 and 1 both have 10 rows" in err and "--minority" in err
    status, _, err = run(["data", "sample", str(even), "--ratio", "1:1", "--minority", "7", "--out",
                          str(tmp_path / "o")], capsys)
    assert status == 2 and f"{even}: minority class '7' is not one of the classes [0, 1]" in err
    regression = write_dataset(tmp_path / "reg", np.arange(10) + 0.5)
    status, _, err = run(["data", "sample", str(regression), "--ratio", "1:1", "--out", str(tmp_path / "o")], capsys)
    assert status == 2 and "regression target" in err
    assert sorted(os.listdir(tmp_path)) == ["even", "reg"]


@pytest.mark.parametrize(("options", "culprit"), [
    (["--test", "0"], "--test '0': expected a number between 0 and 1"),
    (["--test", "1"], "--test '1'"), (["--test", "1.5"], "--test '1.5'"), (["--test", "abc"], "--test 'abc'"),
    (["--test", "0.001"], "leaves the test set empty"), (["--test", "0.999"], "leaves the training set empty"),
    (["--test", "0.2", "--out-train", "same", "--out-test", "same"], "would both be written to"),
    (["--test", "0.2", "--out-test", "taken"], "taken: already exists"),
])
def test_bad_split_requests_exit_2_and_leave_nothing(claims, tmp_path, capsys, monkeypatch, options, culprit):
    path, _ = claims
    (tmp_path / "taken").mkdir()
    monkeypatch.chdir(tmp_path)
    status, _, err = run(["data", "split", str(path), *options], capsys)
    assert status == 2 and err.startswith("shoal: error: ") and culprit in err and err.count("\n") == 1
    assert str(path) in err or "taken" in err
    assert sorted(os.listdir(tmp_path)) == ["claims", "taken"] and os.listdir(tmp_path / "taken") == []


def test_split_errors_for_missing_data_and_regression_stratify(tmp_path, capsys):
    status, _, err = run(["data", "split", str(tmp_path / "nothing"), "--test", "0.2"], capsys)
    assert status == 2 and err == f"shoal: error: {tmp_path / 'nothing'}: dataset not found\n"
    regression = write_dataset(tmp_path / "reg", np.arange(10) + 0.5)
    status, _, err = run(["data", "split", str(regression), "--test", "0.2", "--stratify"], capsys)
    assert status == 2 and err == f"shoal: error: {regression}: the labels are a regression target, not classes\n"
    status, _, err = run(["data", "describe", str(tmp_path / "nothing")], capsys)
    assert status == 2 and "dataset not found" in err
    assert sorted(os.listdir(tmp_path)) == ["reg"]


def test_a_failure_writing_the_test_set_removes_the_training_set(claims, tmp_path, monkeypatch):
    path, _ = claims
    close = DatasetWriter.close

    def raced_close(writer):  # another process takes the test folder's name while the split runs
        if writer.path.endswith("-test"):
            os.mkdir(writer.path)
        close(writer)

    monkeypatch.setattr(DatasetWriter, "close", raced_close)
    with pytest.raises(DataError, match="claims-test: already exists"):
        split(path, test=0.2)
    assert sorted(os.listdir(tmp_path)) == ["claims", "claims-test"] and os.listdir(tmp_path / "claims-test") == []


# ---------------------------------------------------------------- the writer's fixed classes


def test_writer_keeps_fixed_classes_and_refuses_others(tmp_path):
    with DatasetWriter(str(tmp_path / "fixed"), (1,), "float32", classes=["b", "a", "c"]) as writer:
        writer.write(np.zeros((2, 1)), np.array(["a", "a"], dtype=object))
    assert open_dataset(str(tmp_path / "fixed")).classes == ["a", "b", "c"]
    with pytest.raises(DataError, match=r"new: label 'z' is not one of the classes \['a', 'b'\]"):
        with DatasetWriter(str(tmp_path / "new"), (1,), "float32", classes=["a", "b"]) as writer:
            writer.write(np.zeros((2, 1)), np.array(["a", "z"]))
    assert sorted(os.listdir(tmp_path)) == ["fixed"]


# ---------------------------------------------------------------- streaming


_POOLS: list[pa.MemoryPool] = []  # a proxy pool must outlive every buffer allocated from it


@contextlib.contextmanager
def peak_memory():
    """Peak bytes held by NumPy (tracemalloc) plus peak bytes held by Arrow, inside the block."""
    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    _POOLS.append(pool)
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    tracemalloc.start()
    peak = {}
    try:
        yield peak
    finally:
        numpy_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        pa.set_memory_pool(previous)
        peak["bytes"] = numpy_peak + pool.max_memory()


def test_reads_stream_one_row_group_at_a_time(tmp_path):
    group_bytes = 128 * 256 * 8  # 256 KB of features per row group, 16 MB in all
    labels = np.arange(64 * 128) % 3
    path = write_dataset(tmp_path / "wide", labels, row_group_size=128, rows_per_file=8 * 128, width=256)
    every_group = [(f"part-{file:05d}.parquet", group) for file in range(8) for group in range(8)]

    dataset = open_dataset(str(path))
    with peak_memory() as whole:
        dataset.read_all()
    assert whole["bytes"] > 64 * group_bytes  # the measure sees features when they are read

    dataset = open_dataset(str(path))
    with peak_memory() as described:
        assert describe(dataset)["class_counts"] == {0: 2731, 1: 2731, 2: 2730}
    assert dataset.opened == every_group and described["bytes"] < group_bytes  # labels only

    dataset = open_dataset(str(path))
    with peak_memory() as divided:
        train, test = split(dataset, test=0.5, stratify=True, train_out=tmp_path / "a", test_out=tmp_path / "b")
    assert dataset.opened == every_group + every_group  # labels, then rows, each group once
    assert divided["bytes"] < 16 * group_bytes and train.rows == test.rows == 4096  # a quarter of the data
