"""Several files (a list, or glob patterns) imported into one dataset, as the import of their concatenation.

Data often comes as many files (mpi_learn reads a list of HDF5 files; a day of claims per CSV file).
Each file is imported on its own, by its format's importer, into a part beside the output folder, so
every check and every error names the file and line at fault. The parts are then joined into the
output in the order given, reconciled as one import of all their rows would have settled them:

- LIBSVM rows are as wide as the largest index in any file (a narrower part gains zero columns);
- a table's one-hot categories are the sorted union of each file's (each part's columns are placed by
  name), and the files must have the same feature columns;
- labels are numbers with a fraction in every part once any part has one; text labels and number
  labels in different files are refused, as are samples of different shapes or types (uint8 rows are
  scaled to [0, 1] when read, float rows are not: joined, one file's rows would be 255 times the other's).

The parts take as much disk as the output, beside it, until the join ends.

The parts live under a temporary name owned by this process (`shoal.data.leftovers`), removed when the
import ends, fails or is stopped.
"""

from __future__ import annotations

import collections
import glob
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shoal.data import leftovers
from shoal.data.encoding import MAX_CATEGORIES, META_KEY, Encoding
from shoal.data.format import MAX_CLASSES, Dataset, DatasetWriter, open_dataset
from shoal.errors import DataError

STANDARD_KEYS = {"format", "version", "rows", "shape", "feature_dtype", "classes", "labeled", "feature_names", "files"}
"""meta.json keys the writer makes; the others (source, encoding) are the importer's, carried over."""
GLOB_CHARACTERS = set("*?[")


def expand_sources(source: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The files `source` names: a path, a glob pattern (matches in sorted order), or a list of either."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not items:
        raise DataError("no source file given")
    found: list[str] = []
    for item in map(str, items):
        if os.path.exists(item) or not GLOB_CHARACTERS & set(item):
            found.append(item)  # a missing plain path is named by the importer's own check
            continue
        matches = sorted(glob.glob(item))
        if not matches:
            raise DataError(f"{item}: matches no file")
        found += matches
    # the same file however it is spelt (relative, absolute, through a link)
    seen = collections.Counter(os.path.realpath(path) for path in found)
    repeated = [path for path in found if seen[os.path.realpath(path)] > 1]
    if repeated:
        raise DataError(f"{repeated[0]}: given twice (its rows would be imported twice)")
    return found


@dataclass(frozen=True)
class Layout:
    """How the parts' rows become the output's: its sample shape, dtype, feature names and meta.json extras."""

    shape: tuple[int, ...]
    dtype: np.dtype
    feature_names: list[str] | None
    extra_meta: dict
    columns: list[np.ndarray | None]
    """Per part, the output column of each of its features (None: the same columns)."""
    float_labels: bool
    classes: list | None


def import_several(sources: list[str], out: str, format: str, import_one: Callable[[str, str], Dataset], *,
                   rows_per_file: int, overwrite: bool, padded: bool, width: int | None = None) -> Dataset:
    """Import each of `sources` with `import_one(source, part_folder)`, then join the parts into `out`.

    `padded`: the format's rows are as wide as their largest feature index (LIBSVM without n_features).
    `width`: a table's feature count as the user gave it, checked against the joined encoding's."""
    parent, name = os.path.split(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    folder = os.path.join(parent, leftovers.owned_name(f".{name}.parts"))
    leftovers.sweep(parent, f".{name}.parts.")
    os.makedirs(folder)
    leftovers.remove_on_stop(folder)
    try:
        parts = [_import_part(import_one, source, os.path.join(folder, f"part-{index:05d}"))
                 for index, source in enumerate(sources)]
        layout = _layout(parts, sources, padded, format)
        if width is not None and width != layout.shape[0]:
            raise DataError(f"{sources[0]} and the other files: encode to {layout.shape[0]} features (categories "
                            f"one-hot), but n_features={width}")
        _join(parts, layout, out, rows_per_file=rows_per_file, overwrite=overwrite)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        leftovers.release(folder)
    return open_dataset(out)


def _import_part(import_one: Callable[[str, str], Dataset], source: str, part: str) -> Dataset:
    """One file's part; an error that names the part's folder (a full disk, say) names the file instead."""
    try:
        return import_one(source, part)
    except DataError as error:
        raise DataError(str(error).replace(part, source)) from None


def _layout(parts: list[Dataset], sources: list[str], padded: bool, format: str) -> Layout:
    first = parts[0]
    extra = {key: value for key, value in first.meta.items() if key not in STANDARD_KEYS}
    if isinstance(extra.get("source"), dict):
        extra["source"] = {**extra["source"], "path": [os.path.abspath(source) for source in sources]}
    if all(META_KEY in part.meta for part in parts):
        encoding = _joint_encoding(parts, sources)
        extra[META_KEY] = encoding.to_meta()
        names = encoding.feature_names
        columns = [_placed(part.feature_names or [], names) for part in parts]
        shape: tuple[int, ...] = (len(names),)
    elif padded:
        width = max(part.shape[0] for part in parts)
        names, columns, shape = None, [np.arange(part.shape[0]) for part in parts], (width,)
    else:
        hint = " (give --color so that every folder's images have as many channels)" if format == "images" else ""
        _check_same(parts, sources, "samples of shape", lambda part: list(part.shape), hint)
        _check_same(parts, sources, "feature names", lambda part: part.feature_names)
        names, columns, shape = first.feature_names, [None] * len(parts), first.shape
    # uint8 rows are images, scaled to [0, 1] when read: beside float rows their 0-255 would pass unscaled
    _check_same(parts, sources, "features of type", lambda part: str(part.feature_dtype))
    dtype = first.feature_dtype
    float_labels = _float_labels(parts, sources)
    return Layout(shape, dtype, names, extra, columns, float_labels, _classes(parts, float_labels, sources))


def _joint_encoding(parts: list[Dataset], sources: list[str]) -> Encoding:
    """The parts' encodings made one: the first's columns, each categorical column's categories united."""
    encodings = [Encoding.from_dataset(part.path) for part in parts]
    first = encodings[0]
    for encoding, source in zip(encodings[1:], sources[1:]):
        if sorted(encoding.columns) != sorted(first.columns) or set(encoding.categories) != set(first.categories):
            raise DataError(f"{source}: its feature columns differ from those of {sources[0]}")
        if encoding.label != first.label:
            raise DataError(f"{source}: its label column {encoding.label!r} differs from {first.label!r} "
                            f"in {sources[0]}")
    categories = {name: tuple(sorted(set().union(*(encoding.categories[name] for encoding in encodings))))
                  for name in first.categories}
    for name, values in categories.items():
        if len(values) > MAX_CATEGORIES:
            raise DataError(f"{sources[0]} and the other files: column {name!r} has {len(values):,} categories, "
                            f"more than {MAX_CATEGORIES:,}")
    return Encoding(first.label, first.columns, categories)


def _placed(names: list[str], joint: list[str]) -> np.ndarray:
    position = {name: index for index, name in enumerate(joint)}
    return np.array([position[name] for name in names], dtype=np.int64)


def _check_same(parts: list[Dataset], sources: list[str], what: str, value: Callable[[Dataset], object],
                hint: str = "") -> None:
    for part, source in zip(parts[1:], sources[1:]):
        if value(part) != value(parts[0]):
            raise DataError(f"{source}: {what} {value(part)}, but {sources[0]} has {value(parts[0])}: files "
                            f"imported together must hold the same kind of rows{hint}")


def _label_kind(part: Dataset) -> str | None:
    """'text', 'float', 'int' or None (unlabeled), read from the part's first row."""
    if not part.labeled:
        return None
    _, _, labels = next(part.iter_rows(0, 1))
    return "text" if labels.dtype.kind in "USO" else ("float" if labels.dtype.kind == "f" else "int")


def _float_labels(parts: list[Dataset], sources: list[str]) -> bool:
    kinds = [_label_kind(part) for part in parts]
    if "text" in kinds and any(kind in ("int", "float") for kind in kinds):
        text, number = kinds.index("text"), next(i for i, kind in enumerate(kinds) if kind in ("int", "float"))
        raise DataError(f"{sources[number]}: its labels are numbers, but those of {sources[text]} are text")
    return "float" in kinds and "int" in kinds


def _classes(parts: list[Dataset], float_labels: bool, sources: list[str]) -> list | None:
    """The union of the parts' classes, as a whole import finds them; None where any part has none."""
    if float_labels or any(part.classes is None for part in parts):
        return None
    classes = sorted(set().union(*(part.classes for part in parts)))
    if len(classes) > MAX_CLASSES:  # the writer checks labels it finds, not classes it is given
        raise DataError(f"{sources[0]} and the other files: more than {MAX_CLASSES} distinct labels; is the label "
                        "column right?")
    return classes


def _join(parts: list[Dataset], layout: Layout, out: str, *, rows_per_file: int, overwrite: bool) -> None:
    labeled = parts[0].labeled
    with DatasetWriter(out, layout.shape, layout.dtype, rows_per_file=rows_per_file, overwrite=overwrite,
                       feature_names=layout.feature_names, extra_meta=layout.extra_meta, labeled=labeled,
                       classes=layout.classes if labeled else None) as writer:
        for part, columns in zip(parts, layout.columns):
            for _, block, labels in part.iter_rows(0, part.rows):
                if columns is not None:
                    placed = np.zeros((len(block), int(np.prod(layout.shape))), dtype=layout.dtype)
                    placed[:, columns] = block
                    block = placed
                if not labeled:
                    labels = None
                elif layout.float_labels:
                    labels = labels.astype(np.float64)
                writer.write(block, labels)
