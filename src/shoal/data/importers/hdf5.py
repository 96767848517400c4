"""Import of an HDF5 file holding a features dataset and a labels dataset, read in row chunks.

The features dataset's first dimension counts samples and the rest is one sample's shape
(uint8 images stay uint8, other numbers become float32); the labels dataset holds one label
per sample (numbers or text). Names default to the common ones (`x`/`features`, `y`/`label`)
and may be paths inside the file (`train/images`). h5py reads a slice of rows at a time, so
memory stays flat however large the file is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.data.encoding import shown
from shoal.data.importers.common import (
    ImportRequest,
    import_writer,
    labels_dtype_of,
    row_locator,
    rows_per_chunk,
    sample_shape_of,
    source_meta,
    stored_dtype,
)
from shoal.errors import DataError

FEATURE_NAMES = ("x", "features", "X", "data")
LABEL_NAMES = ("y", "label", "labels", "Y", "targets")


def import_file(request: ImportRequest) -> None:
    import h5py  # only HDF5 imports need it

    source = request.source
    try:
        handle = h5py.File(source, "r")
    except OSError as error:
        raise DataError(f"{source}: not a readable HDF5 file ({error})") from None
    with handle:
        features = _dataset(source, handle, request.features, FEATURE_NAMES, "features")
        labels = _dataset(source, handle, request.label, LABEL_NAMES, "label")
        _copy(request, features, labels, text_labels=h5py.check_string_dtype(labels.dtype) is not None)


def _copy(request: ImportRequest, features: Any, labels: Any, text_labels: bool) -> None:
    """Check that the two datasets match, then hand their rows to the writer a chunk at a time."""
    source = request.source
    where = f"{source}:{features.name}"
    sample_shape = sample_shape_of(where, features.shape, features.dtype, request.n_features)
    label_dtype = np.dtype(str) if text_labels else labels.dtype
    labels_target = labels_dtype_of(f"{source}:{labels.name}", labels.shape, label_dtype)
    if labels.shape[0] != features.shape[0]:
        raise DataError(f"{source}: {features.name} holds {features.shape[0]:,} samples "
                        f"but {labels.name} holds {labels.shape[0]:,} labels")
    if features.shape[0] == 0:
        raise DataError(f"{where}: holds no samples: the source is empty")
    rows = rows_per_chunk(sample_shape, features.dtype)
    stored = stored_dtype(features.dtype)
    meta = source_meta("hdf5", source, features=features.name, labels=labels.name)
    read_labels = labels.asstr() if text_labels else labels
    locate = row_locator(f"{source}:{labels.name}")  # the labels are where a bad one is
    with import_writer(request.out, sample_shape, stored, request.writer_options, locate=locate,
                       extra_meta=meta) as writer:
        for start in range(0, features.shape[0], rows):
            stop = min(start + rows, features.shape[0])
            try:
                block = features[start:stop]
                targets = np.asarray(read_labels[start:stop]).reshape(-1)
            except (OSError, ValueError, TypeError) as error:
                raise DataError(f"{source}: cannot read rows {start + 1}-{stop}: {error}") from None
            writer.write(block.reshape(stop - start, *sample_shape).astype(stored), targets.astype(labels_target))


def _dataset(source: str, handle: Any, name: str | None, defaults: tuple[str, ...], what: str) -> Any:
    """The dataset `name`, or the first of `defaults` present; an error lists what the file holds."""
    import h5py

    held: list[str] = []

    def collect(path: str, item: Any) -> None:  # returning None lets h5py visit everything
        if isinstance(item, h5py.Dataset):
            held.append(path)

    handle.visititems(collect)
    if name is None:
        name = next((default for default in defaults if default in held), None)
        if name is None:
            option = "--features" if what == "features" else "--label"
            raise DataError(f"{source}: no {what} dataset named {' or '.join(defaults)}; name it with {option} "
                            f"(the file holds: {shown(held) or 'no datasets'})")
    item = handle.get(name)
    if not isinstance(item, h5py.Dataset):
        raise DataError(f"{source}: no dataset {name!r} (the file holds: {shown(held) or 'no datasets'})")
    if item.shape is None or len(item.shape) == 0:
        raise DataError(f"{source}:{item.name}: holds a single value, not one row per sample")
    if what == "features" and item.dtype.kind not in "biuf":
        raise DataError(f"{source}:{item.name}: features have dtype {item.dtype}; expected numbers")
    return item
