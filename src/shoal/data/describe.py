"""What a dataset holds: rows, sample shape, classes and their counts, files and bytes.

`shoal data describe` and the dataset derivations (split, under-sampling) need the labels of
every row but none of the features, so this module reads the `label` column alone, one row
group at a time: a dataset of any size is described in the memory of its labels.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from shoal.data.format import META_FILE, Dataset, column_values, open_dataset
from shoal.errors import DataError

# Keys of meta.json that say where the rows came from, shown as they are.
PROVENANCE_KEYS = ("source", "encoding", "derived")


def as_dataset(dataset: Dataset | str | os.PathLike) -> Dataset:
    """An opened dataset, given one or its folder (a local path or a URI)."""
    return dataset if isinstance(dataset, Dataset) else open_dataset(os.fspath(dataset))


def iter_labels(dataset: Dataset) -> Iterator[np.ndarray]:
    """The raw labels of every row, in order, one row group at a time; features are never read."""
    filesystem, root = dataset._filesystem, dataset._root  # the store the dataset was opened from
    for info in dataset.files:
        try:
            with filesystem.open_input_file(f"{root}/{info.name}") as handle:
                parquet = pq.ParquetFile(handle)
                for group, group_rows in enumerate(info.row_groups):
                    table = parquet.read_row_group(group, columns=["label"])
                    dataset.opened.append((info.name, group))
                    if table.num_rows != group_rows:
                        raise DataError(f"{dataset.path}/{info.name}: row group {group} holds {table.num_rows} "
                                        f"rows, {META_FILE} says {group_rows}")
                    yield column_values(table.column("label"))
        except (OSError, pa.ArrowException, ValueError) as error:
            raise DataError(f"{dataset.path}/{info.name}: cannot read Parquet file: {error}") from None


def class_indices(dataset: Dataset) -> np.ndarray:
    """The class index (0..K-1) of every row, read label column only; an unknown label is an error."""
    if dataset.classes is None:
        raise DataError(f"{dataset.path}: the labels are a regression target, not classes")
    parts = [dataset.label_indices(labels, dataset.path) for labels in iter_labels(dataset)]
    return np.concatenate(parts)


def describe(dataset: Dataset | str | os.PathLike) -> dict[str, Any]:
    """Everything `shoal data describe` shows, as a dict.

    Keys: path, rows, shape, features, feature_dtype, feature_names, classes, class_counts
    (class -> rows, in class order; None for a regression target), target (min, max, mean of
    a regression target, else None), files (name, rows, row_groups, bytes), bytes (all files
    and meta.json), fields and label_key (rows of dict items: each field's name, shape and dtype; else
    None), and source, encoding, derived as meta.json records them (None if absent).
    """
    dataset = as_dataset(dataset)
    class_counts, target = None, None
    if dataset.classes is not None:
        counts = np.zeros(len(dataset.classes), dtype=np.int64)
        for labels in iter_labels(dataset):
            counts += np.bincount(dataset.label_indices(labels, dataset.path), minlength=len(counts))
        class_counts = dict(zip(dataset.classes, counts.tolist(), strict=True))
    else:
        low, high, total = np.inf, -np.inf, 0.0
        for labels in iter_labels(dataset):
            values = labels.astype(np.float64)
            low, high, total = min(low, values.min()), max(high, values.max()), total + values.sum()
        target = {"min": float(low), "max": float(high), "mean": total / dataset.rows}
    sizes = _file_sizes(dataset)
    files = [{"name": info.name, "rows": info.rows, "row_groups": len(info.row_groups), "bytes": sizes[info.name]}
             for info in dataset.files]
    return {
        "path": dataset.path,
        "rows": dataset.rows,
        "shape": list(dataset.shape),
        "features": dataset.features,
        "feature_dtype": dataset.feature_dtype.name,
        "feature_names": dataset.feature_names,
        "classes": dataset.classes,
        "class_counts": class_counts,
        "target": target,
        "files": files,
        "bytes": sum(sizes.values()),
        "fields": dataset.fields,
        "label_key": dataset.label_key,
        **{key: dataset.meta.get(key) for key in PROVENANCE_KEYS},
    }


def _file_sizes(dataset: Dataset) -> dict[str, int]:
    """Bytes of each data file and of meta.json, as the store reports them."""
    names = [info.name for info in dataset.files] + [META_FILE]
    try:
        stats = dataset._filesystem.get_file_info([f"{dataset._root}/{name}" for name in names])
    except (OSError, pa.ArrowException) as error:
        raise DataError(f"{dataset.path}: cannot list the dataset's files: {error}") from None
    for name, stat in zip(names, stats, strict=True):
        if stat.type != pafs.FileType.File:
            raise DataError(f"{dataset.path}/{name}: missing (listed in {META_FILE})")
    return {name: stat.size for name, stat in zip(names, stats, strict=True)}


def render(description: dict[str, Any], max_files: int = 20) -> str:
    """`describe()`'s dict as the text `shoal data describe` prints."""
    lines = [f"{description['path']}: {description['rows']:,} rows, sample shape {description['shape']} "
             f"({description['features']:,} features, {description['feature_dtype']})"]
    if description.get("fields"):  # rows of dict items: what each batch's dict holds
        lines.append("fields: " + ", ".join(f"{field['name']} {field['shape']} {field['dtype']}"
                                            for field in description["fields"])
                     + f"; label {description['label_key']!r}")
    if description["class_counts"] is not None:
        counts = description["class_counts"]
        lines.append(f"classes: {len(counts)}")
        width = max(len(str(label)) for label in counts)
        for label, count in counts.items():
            lines.append(f"  {str(label):<{width}}  {count:>12,}  {100 * count / description['rows']:5.1f}%")
    else:
        target = description["target"]
        lines.append(f"target: regression, min {target['min']:g}, max {target['max']:g}, mean {target['mean']:g}")
    files = description["files"]
    lines.append(f"files: {len(files)}, {_size(description['bytes'])} on disk")
    for entry in files[:max_files]:
        groups = f"{entry['row_groups']} row group" + ("s" if entry["row_groups"] != 1 else "")
        lines.append(f"  {entry['name']}  {entry['rows']:>12,} rows  {groups:>14}  "
                     f"{_size(entry['bytes']):>9}")
    if len(files) > max_files:
        lines.append(f"  ... {len(files) - max_files} more (--json lists all)")
    for key in PROVENANCE_KEYS:
        if description[key] is not None:
            text = json.dumps(description[key], default=str)
            lines.append(f"{key}: {text if len(text) <= 300 else text[:300] + ' ... (--json shows all)'}")
    return "\n".join(lines)


def _size(count: int) -> str:
    """Bytes in decimal units: 950 B, 12.3 MB."""
    units = ("B", "KB", "MB", "GB", "TB")
    power = min(len(units) - 1, int(math.log10(max(count, 1)) // 3))
    return f"{count} B" if power == 0 else f"{count / 1000**power:.1f} {units[power]}"
