"""The checks on a dataset's `meta.json`: every field the reader relies on, named when it is bad.

`meta.json` is data a person can edit or a copy can damage. A field of the wrong kind
(`"feature_dtype": "float99"`, a shape of strings, row groups that are not numbers) would
otherwise surface as a traceback far from the file, in NumPy or in a worker. Each check
here fails with one line naming the file and the key.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.errors import DataError

FORMAT_NAME = "shoal.dataset"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
NUMBER_KINDS = "biuf"  # booleans, integers, floats: what converts to a float tensor
LARGEST_ITEM = 8  # bytes; float128 has no tensor type
FIELD_DTYPES = {"f": "float32", "i": "int64", "b": "bool"}
"""A dict item's field by its kind of values (booleans, integers, floats) -> its dtype in the dataset's `fields`
and its tensor's in a batch."""


def whole(value: Any) -> bool:
    """A JSON whole number (`true` is not one, though Python counts it as an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_meta(meta: Any, where: str) -> None:
    """Raise a `DataError` naming `where` and the key at fault unless `meta` describes a readable dataset."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise DataError(f"{where}: not a shoal dataset description")
    if not whole(meta.get("version")) or meta["version"] not in READABLE_VERSIONS:
        raise DataError(f"{where}: unsupported format version {meta.get('version')!r}")
    for key, kind in (("rows", int), ("shape", list), ("feature_dtype", str), ("files", list)):
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise DataError(f"{where}: key '{key}' missing or not a {kind.__name__}")
    if meta["rows"] <= 0:
        raise DataError(f"{where}: the dataset is empty")
    if not all(whole(size) and size >= 1 for size in meta["shape"]):
        raise DataError(f"{where}: key 'shape': {meta['shape']!r} is not a list of whole numbers >= 1")
    number_dtype(meta["feature_dtype"], where)
    _check_files(meta["files"], where)
    if sum(entry["rows"] for entry in meta["files"]) != meta["rows"]:
        raise DataError(f"{where}: file row counts do not add up to 'rows'")
    _check_classes(meta.get("classes"), where)
    _check_feature_names(meta.get("feature_names"), int(np.prod(meta["shape"])), where)
    _check_fields(meta.get("fields"), meta.get("label_key"), int(np.prod(meta["shape"])), where)


def number_dtype(name: str, where: str) -> np.dtype:
    """The NumPy dtype `meta.json` names for the features; a number type or a `DataError`."""
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.kind not in NUMBER_KINDS or dtype.fields or dtype.subdtype \
            or dtype.itemsize > LARGEST_ITEM:
        raise DataError(f"{where}: key 'feature_dtype': {name!r} is not a number type "
                        "(such as float32, float64, int64 or uint8)")
    return dtype


def _check_files(files: list, where: str) -> None:
    for number, entry in enumerate(files):
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str) and whole(entry.get("rows"))
                and isinstance(entry.get("row_groups"), list)):
            raise DataError(f"{where}: key 'files': each file entry needs 'name', 'rows' and 'row_groups' "
                            f"(entry {number} has not)")
        name, rows, groups = entry["name"], entry["rows"], entry["row_groups"]
        if not name or name.startswith(".") or "/" in name or "\\" in name:
            raise DataError(f"{where}: key 'files': {name!r} is not the name of a file in the dataset folder")
        if rows < 0 or not all(whole(group) and group >= 0 for group in groups):
            raise DataError(f"{where}: key 'files': the rows of {name!r} are not whole numbers >= 0")
        if sum(groups) != rows:
            raise DataError(f"{where}: key 'files': row groups of {name!r} do not add up to its rows")


def _check_classes(classes: Any, where: str) -> None:
    """None (a regression target), or the labels in increasing order: class indices come from a search."""
    if classes is None:
        return
    if not (isinstance(classes, list) and classes and all(isinstance(label, str | int | float) for label in classes)):
        raise DataError(f"{where}: key 'classes': not null or a list of labels")
    try:
        increasing = all(a < b for a, b in zip(classes, classes[1:]))
    except TypeError:
        raise DataError(f"{where}: key 'classes': mixes text and numbers") from None
    if not increasing:
        raise DataError(f"{where}: key 'classes': not sorted, or a label appears twice")


def _check_feature_names(names: Any, features: int, where: str) -> None:
    if names is None:
        return
    if not (isinstance(names, list) and all(isinstance(name, str) for name in names)):
        raise DataError(f"{where}: key 'feature_names': not null or a list of names")
    if len(names) != features:
        raise DataError(f"{where}: key 'feature_names': {len(names)} names for {features} features")


def _check_fields(fields: Any, label_key: Any, features: int, where: str) -> None:
    """null, or the fields of dict items: named once each, shaped, typed, and together as wide as a row."""
    if fields is None:
        return
    if not (isinstance(fields, list) and fields):
        raise DataError(f"{where}: key 'fields': not null or a list of fields")
    names: set[str] = set()
    values = 0
    for number, entry in enumerate(fields):
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str) and entry["name"]
                and isinstance(entry.get("shape"), list) and all(whole(size) and size >= 1 for size in entry["shape"])
                and entry.get("dtype") in FIELD_DTYPES.values()):
            raise DataError(f"{where}: key 'fields': each field needs a 'name', a 'shape' of whole numbers >= 1 and "
                            f"a 'dtype' ({', '.join(FIELD_DTYPES.values())}) "
                            f"(entry {number} has not)")
        if entry["name"] in names:
            raise DataError(f"{where}: key 'fields': {entry['name']!r} appears twice")
        names.add(entry["name"])
        values += int(np.prod(entry["shape"]))
    if values != features:
        raise DataError(f"{where}: key 'fields': the fields hold {values} values a row; the shape, {features}")
    if not (isinstance(label_key, str) and label_key) or label_key in names:
        raise DataError(f"{where}: key 'label_key': {label_key!r} is not a name apart from the fields'")
