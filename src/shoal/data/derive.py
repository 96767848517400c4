"""Datasets made from a dataset: a seeded train/test split, random subsets and under-sampling.

Both decide from the labels alone which rows go where (a seeded draw over row numbers: the
labels of millions of rows fit in memory, their features need not), then stream the rows one
row group at a time into new dataset folders through `DatasetWriter`. A derived dataset keeps
its parent's sample shape, dtype, feature names, classes (even a class it holds no row of) and
the other keys of its meta.json (`source`, `encoding`), and appends how it was made to the
list under `derived`. Outputs appear together or not at all.

Under-sampling follows the Parallel SGD study of Medicare fraud (Kennedy et al.): every row of
the minority class plus `ratio` times as many rows drawn at random, without replacement, from
the majority. With more than two classes the majority is all classes but the minority, drawn
from as one pool. Rows keep their input order; training shuffles them every epoch anyway.
"""

from __future__ import annotations

import math
import os
import shutil
from fractions import Fraction
from typing import Any

import numpy as np

from shoal.data.describe import as_dataset, class_indices
from shoal.data.format import Dataset, DatasetWriter, full_disk, open_dataset
from shoal.durable import disk_full
from shoal.errors import DataError

# meta.json keys the writer derives from the rows; every other key is carried to derived sets.
FORMAT_KEYS = frozenset({"format", "version", "rows", "shape", "feature_dtype", "classes", "feature_names", "files"})


def parse_fraction(value: float | str, where: str) -> Fraction:
    """A fraction strictly between 0 and 1, from a number or its text; errors begin with `where`."""
    try:
        fraction = Fraction(str(value).strip())
    except (ValueError, ZeroDivisionError):
        fraction = None
    if fraction is None or not 0 < fraction < 1:
        raise DataError(f"{where} {value!r}: expected a number between 0 and 1 (exclusive), like 0.2")
    return fraction


def parse_ratio(value: float | str, where: str) -> Fraction:
    """Majority rows per minority row, from 'MINORITY:MAJORITY' text (1:25) or one number (25)."""
    try:
        parts = str(value).strip().split(":")
        if len(parts) > 2:
            raise ValueError("more than one ':'")
        ratio = Fraction(parts[-1]) / Fraction(parts[0] if len(parts) == 2 else 1)
    except (ValueError, ZeroDivisionError):
        ratio = None
    if ratio is None or ratio <= 0:
        raise DataError(f"{where} {value!r}: expected MINORITY:MAJORITY with positive numbers, like 1:25")
    return ratio


def split(
    dataset: Dataset | str | os.PathLike,
    *,
    test: float | str,
    stratify: bool = False,
    seed: int = 0,
    train_out: str | os.PathLike | None = None,
    test_out: str | os.PathLike | None = None,
) -> tuple[Dataset, Dataset]:
    """Split the rows at random into a training set and a test set with `test` of the rows.

    The test set gets round(test x rows) rows. With `stratify` each class keeps its proportion:
    a class of n rows puts floor or ceil of test x n of them in the test set (largest remainders
    round up, so the total stays exact). Outputs default to DIR-train and DIR-test beside DIR.
    """
    dataset = as_dataset(dataset)
    fraction = parse_fraction(test, f"{dataset.path}: test fraction")
    base = dataset.path.rstrip("/")
    train_out = os.fspath(train_out) if train_out is not None else f"{base}-train"
    test_out = os.fspath(test_out) if test_out is not None else f"{base}-test"
    if os.path.abspath(train_out) == os.path.abspath(test_out):
        raise DataError(f"{dataset.path}: the training and test sets would both be written to {train_out}")
    test_rows = _round(fraction * dataset.rows)
    if not 0 < test_rows < dataset.rows:
        side = "test" if test_rows == 0 else "training"
        raise DataError(f"{dataset.path}: a test fraction of {float(fraction):g} of {dataset.rows:,} rows "
                        f"leaves the {side} set empty")
    generator = np.random.default_rng(seed)
    if stratify:
        chosen = _stratified_draw(class_indices(dataset), fraction, generator)
    else:
        chosen = generator.permutation(dataset.rows)[:test_rows]
    to_test = np.zeros(dataset.rows, dtype=bool)
    to_test[chosen] = True
    how = {"operation": "split", "from": _location(dataset), "test": float(fraction), "stratify": stratify,
           "seed": seed}
    train_set, test_set = _write(dataset, [(train_out, ~to_test, {**how, "side": "train"}),
                                           (test_out, to_test, {**how, "side": "test"})])
    return train_set, test_set


def sample(
    dataset: Dataset | str | os.PathLike,
    out: str | os.PathLike,
    *,
    ratio: float | str,
    seed: int = 0,
    minority: Any = None,
) -> Dataset:
    """Under-sample: every minority row plus round(ratio x minority rows) majority rows drawn at random.

    `ratio` is majority rows per minority row, as 'MINORITY:MAJORITY' text (1:25) or a number.
    The minority is the class `minority` (a class or its text), by default the class with the
    fewest rows; classes without rows are left out of that choice.
    """
    dataset = as_dataset(dataset)
    per_minority = parse_ratio(ratio, f"{dataset.path}: ratio")
    indices = class_indices(dataset)
    counts = np.bincount(indices, minlength=len(dataset.classes))
    if np.count_nonzero(counts) < 2:
        raise DataError(f"{dataset.path}: only class {dataset.classes[int(counts.argmax())]!r} has rows; "
                        "under-sampling needs two classes")
    chosen_class = _minority_class(dataset, counts, minority)
    label = dataset.classes[chosen_class]
    minority_rows = int(counts[chosen_class])
    majority_available = dataset.rows - minority_rows
    wanted = _round(per_minority * minority_rows)
    ratio_text = f"1:{float(per_minority):g}"
    if wanted == 0:
        raise DataError(f"{dataset.path}: ratio {ratio_text} of {minority_rows:,} minority rows "
                        f"(class {label!r}) gives no majority rows")
    if wanted > majority_available:
        raise DataError(f"{dataset.path}: ratio {ratio_text} needs {wanted:,} majority rows for the {minority_rows:,} "
                        f"rows of class {label!r}, but the other classes hold only {majority_available:,}")
    generator = np.random.default_rng(seed)
    keep = indices == chosen_class
    keep[generator.choice(np.flatnonzero(~keep), size=wanted, replace=False)] = True
    how = {"operation": "sample", "from": _location(dataset), "ratio": ratio_text, "minority": label,
           "minority_rows": minority_rows, "majority_rows": wanted, "seed": seed}
    (sampled,) = _write(dataset, [(os.fspath(out), keep, how)])
    return sampled


def subset(
    dataset: Dataset | str | os.PathLike,
    out: str | os.PathLike,
    *,
    rows: int,
    seed: int = 0,
) -> Dataset:
    """`rows` rows drawn at random without replacement, each class keeping its proportion.

    A class of n rows gives floor or ceil of rows/total x n of them (largest remainders round
    up, so the total is exact); a dataset without classes is drawn from as one pool.
    """
    dataset = as_dataset(dataset)
    if isinstance(rows, bool) or not isinstance(rows, int) or not 0 < rows < dataset.rows:
        raise DataError(f"{dataset.path}: a subset needs between 1 and {dataset.rows - 1:,} rows "
                        f"(the dataset holds {dataset.rows:,}), got {rows!r}")
    fraction = Fraction(rows, dataset.rows)
    generator = np.random.default_rng(seed)
    if dataset.classes is None:
        chosen = generator.choice(dataset.rows, size=rows, replace=False)
    else:
        chosen = _stratified_draw(class_indices(dataset), fraction, generator)
    keep = np.zeros(dataset.rows, dtype=bool)
    keep[chosen] = True
    how = {"operation": "subset", "from": _location(dataset), "rows": rows, "seed": seed}
    (taken,) = _write(dataset, [(os.fspath(out), keep, how)])
    return taken


def _location(dataset: Dataset) -> str:
    """Where the parent is, in a form that stays true whatever the working folder."""
    return dataset.path if "://" in dataset.path else os.path.abspath(dataset.path)


def _round(value: Fraction) -> int:
    """Round half up, exactly."""
    return math.floor(value + Fraction(1, 2))


def _stratified_draw(indices: np.ndarray, fraction: Fraction, generator: np.random.Generator) -> np.ndarray:
    """Rows for the test set, floor or ceil of fraction x n from each class of n rows."""
    counts = np.bincount(indices).tolist()
    exact = [fraction * count for count in counts]
    taken = [math.floor(share) for share in exact]
    # Largest remainders round up (ties in class order) until the total is round(fraction x rows).
    by_remainder = sorted(range(len(counts)), key=lambda index: taken[index] - exact[index])
    for index in by_remainder[: _round(fraction * len(indices)) - sum(taken)]:
        taken[index] += 1
    order = np.argsort(indices, kind="stable")  # rows of class 0, then class 1, ...
    bounds = np.cumsum([0, *counts])
    chosen = [generator.choice(order[bounds[index] : bounds[index + 1]], size=count, replace=False)
              for index, count in enumerate(taken)]
    return np.concatenate(chosen)


def _minority_class(dataset: Dataset, counts: np.ndarray, minority: Any) -> int:
    """The index of the minority class: the one named, or the one with the fewest rows."""
    if minority is not None:
        matches = [index for index, label in enumerate(dataset.classes) if label == minority or str(label) == minority]
        if not matches:
            raise DataError(f"{dataset.path}: minority class {minority!r} is not one of the classes {dataset.classes}")
        if counts[matches[0]] == 0:
            raise DataError(f"{dataset.path}: minority class {minority!r} has no rows")
        return matches[0]
    present = np.flatnonzero(counts)
    fewest = present[counts[present] == counts[present].min()]
    if len(fewest) > 1:
        names = " and ".join(repr(dataset.classes[index]) for index in fewest[:2])
        raise DataError(f"{dataset.path}: classes {names} both have {int(counts[fewest[0]]):,} rows, the fewest: "
                        "name the minority class (--minority)")
    return int(fewest[0])


def _write(dataset: Dataset, outputs: list[tuple[str, np.ndarray, dict[str, Any]]]) -> list[Dataset]:
    """Stream the rows of `dataset` into each (folder, row mask, derivation) output; all or nothing."""
    carried = {key: value for key, value in dataset.meta.items() if key not in FORMAT_KEYS}
    lineage = carried.pop("derived", None)
    lineage = lineage if isinstance(lineage, list) else ([] if lineage is None else [lineage])
    layout = {  # the parent's file and row-group sizes, which its importer chose for its row width
        "rows_per_file": max(info.rows for info in dataset.files),
        "row_group_size": max(max(info.row_groups) for info in dataset.files),
    }
    writers: list[DatasetWriter] = []
    finished: list[str] = []
    try:
        for path, _, how in outputs:
            writers.append(DatasetWriter(path, dataset.shape, dataset.feature_dtype, **layout,
                                         classification=dataset.classes is not None, classes=dataset.classes,
                                         feature_names=dataset.feature_names,
                                         extra_meta={**carried, "derived": [*lineage, how]}))
        for position, features, labels in dataset.iter_rows(0, dataset.rows):
            for writer, (_, mask, _) in zip(writers, outputs, strict=True):
                take = mask[position : position + len(features)]
                if take.any():
                    writer.write(features[take], labels[take])
        for writer in writers:
            writer.close()
            finished.append(writer.path)
    except BaseException as error:
        for writer in writers:
            writer.abort()
        for path in finished:  # an earlier output already in place goes too: all or nothing
            shutil.rmtree(path, ignore_errors=True)
        if disk_full(error):
            raise full_disk(" and ".join(path for path, _, _ in outputs)) from None
        raise
    return [open_dataset(path) for path, _, _ in outputs]
