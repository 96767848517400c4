"""Whether a dataset holds the same kind of rows as a reference: a test set as its training set, a
prediction set as the set a model was trained on.

A model reads features by position and in the dtype it was trained on: a uint8 image where it
learned float32 values, or a column of ages where it learned incomes, gives predictions that are
wrong without a word. So the fields of dict items (and the label's key among them), the feature
dtype, the sample shape, the feature names and the one-hot encoding must agree. The reference is
plain data (`schema`), so a run directory can keep it in model.pt and check a dataset long after
the training set is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shoal.data.format import Dataset
from shoal.errors import DataError

FEATURES = ("fields", "label_key", "feature_dtype", "shape", "feature_names", "encoding")
"""What a model reads: a prediction set must match its training set in these."""
TRAINING = (*FEATURES, "classes")
"""A test set must also have its training set's classes (metrics compare class indices)."""
ITEMS = ("fields", "label_key")
"""Kept in a schema only for rows of dict items: a reference without them (one from before dict items, too)
was of (features, label) pairs."""
SHOWN = 5  # names listed in a message before "..."


def schema(dataset: Dataset) -> dict[str, Any]:
    """What another dataset is compared with, as plain data (torch.load with weights_only reads it back)."""
    return {
        "feature_dtype": dataset.feature_dtype.name,
        "shape": list(dataset.shape),
        "feature_names": dataset.feature_names,
        "encoding": dataset.meta.get("encoding"),
        "classes": dataset.classes,
        **({"fields": dataset.fields, "label_key": dataset.label_key} if dataset.fields else {}),
    }


def _shown(names: Sequence) -> str:
    return ", ".join(map(repr, names[:SHOWN])) + (", ..." if len(names) > SHOWN else "")


def _names_difference(expected: list, actual: list | None) -> str | None:
    if not isinstance(actual, list):
        return f"it has no feature names, where {_shown(expected)} were expected"
    for index, (want, have) in enumerate(zip(expected, actual)):
        if want != have:
            return f"feature {index} is {have!r}, not {want!r}"
    if len(expected) != len(actual):
        return f"{len(actual)} feature names, not {len(expected)}"
    return None


def _encoding_difference(expected: dict, actual: dict | None) -> str | None:
    """The encoded columns and their categories; the label column's name does not reach the model."""
    if not isinstance(actual, dict):
        return None  # the feature names, compared before, already say which features these are
    if list(actual.get("columns") or []) != list(expected.get("columns") or []):
        return f"encoded columns {_shown(actual.get('columns') or [])}, not {_shown(expected.get('columns') or [])}"
    have, want = actual.get("categories") or {}, expected.get("categories") or {}
    for column in sorted(set(have) | set(want)):
        if list(have.get(column) or []) != list(want.get(column) or []):
            return (f"column {column!r} is one-hot encoded with categories {_shown(have.get(column) or [])}, "
                    f"not {_shown(want.get(column) or [])}")
    return None


def _fields_difference(expected: list | None, actual: list | None) -> str | None:
    """Dict items' fields, by name, shape and dtype in order; or one set of dict items and one of pairs."""
    if expected is None or actual is None:
        if expected is actual:
            return None
        names = _shown([field["name"] for field in expected or actual])
        return (f"its rows are (features, label) pairs, not dict items of fields {names}" if actual is None
                else f"its rows are dict items of fields {names}, not (features, label) pairs")
    for index, (want, have) in enumerate(zip(expected, actual)):
        if want["name"] != have["name"]:
            return f"field {index + 1} is {have['name']!r}, not {want['name']!r}"
        if list(have["shape"]) != list(want["shape"]):
            return f"field {have['name']!r} has shape {list(have['shape'])}, not {list(want['shape'])}"
        if have["dtype"] != want["dtype"]:
            return f"field {have['name']!r} holds {have['dtype']}, not {want['dtype']}"
    if len(expected) != len(actual):
        names = [[field["name"] for field in fields] for fields in (actual, expected)]
        return f"fields {_shown(names[0])}, not {_shown(names[1])}"
    return None


def first_difference(reference: dict, dataset: Dataset, keys: Sequence[str] = FEATURES) -> str | None:
    """The first way `dataset` differs from `reference` in `keys`, in words; None when it does not.

    A key the reference lacks (a model.pt from an older shoal) is not compared, but for the fields of
    dict items (lacking, there were none), nor feature names or an encoding the reference holds as
    None (a training set without them).
    """
    actual = {key: None for key in ITEMS} | schema(dataset)
    for key in [key for key in keys if key in reference or key in ITEMS]:
        expected = reference.get(key)
        difference = None
        if key == "fields":
            difference = _fields_difference(expected, actual[key])
        elif key == "label_key" and expected != actual[key] and None not in (expected, actual[key]):
            difference = f"the label's key is {actual[key]!r}, not {expected!r}"
        elif key == "feature_names" and expected is not None:
            difference = _names_difference(list(expected), actual[key])
        elif key == "encoding" and isinstance(expected, dict):
            difference = _encoding_difference(expected, actual[key])
        elif key == "shape" and list(expected) != actual[key]:
            difference = f"sample shape {actual[key]}, not {list(expected)}"
        elif key == "feature_dtype" and expected != actual[key]:
            difference = f"features are {actual[key]}, not {expected}"
        elif key == "classes" and expected != actual[key]:
            difference = f"classes {actual[key]}, not {expected}"
        if difference:
            return difference
    return None


def check_compatible(dataset: Dataset, reference: dict, against: str, keys: Sequence[str] = FEATURES) -> None:
    """A one-line DataError naming the dataset and the first difference from `reference` (described by `against`)."""
    difference = first_difference(reference, dataset, keys)
    if difference is not None:
        raise DataError(f"{dataset.path}: does not match {against}: {difference}")
