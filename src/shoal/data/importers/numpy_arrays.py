"""Import of NumPy arrays: a features `.npy` with a labels `.npy` (format npy), or one `.npz` holding `x` and `y`.

A `.npy` is memory-mapped and copied a chunk of rows at a time; a `.npz` (a zip file, compressed
or not) is streamed member by member from its `.npy` headers, so neither is loaded whole.
Format npy takes a `.npz` too: a zip file is read as one whatever the format says.
"""

from __future__ import annotations

import math
import os
import zipfile
from typing import IO

import numpy as np
import numpy.lib.format as npy_format

from shoal.data.importers.common import (
    ImportRequest,
    check_file,
    import_writer,
    labels_dtype_of,
    row_locator,
    rows_per_chunk,
    sample_shape_of,
    source_meta,
    stored_dtype,
)
from shoal.errors import DataError


def import_file(request: ImportRequest) -> None:
    source = request.source
    if zipfile.is_zipfile(source):
        _import_archive(request)
        return
    if request.format == "npz":
        raise DataError(f"{source}: not a .npz archive (a zip file of .npy arrays)")
    _import_pair(request)


def _import_pair(request: ImportRequest) -> None:
    """A features `.npy` and the labels `.npy` that `request.label` names."""
    source, label = request.source, request.label
    if request.unlabeled:
        _import_features(request)
        return
    if label is None:
        raise DataError(f"{source}: a features .npy needs its labels: pass the labels .npy as label "
                        "(or import it unlabeled, to predict)")
    check_file(label)
    features = _load(source)
    labels = _load(label)
    sample_shape = sample_shape_of(source, features.shape, features.dtype, request.n_features)
    labels_dtype = labels_dtype_of(label, labels.shape, labels.dtype)
    if len(labels) != len(features):
        raise DataError(f"{source} has {len(features)} samples but {label} has {len(labels)} labels")
    if len(features) == 0:
        raise DataError(f"{source}: holds no samples: the source is empty")
    rows = rows_per_chunk(sample_shape, features.dtype)
    meta = source_meta("npy", source, labels=os.path.abspath(label))
    dtype = stored_dtype(features.dtype)
    with import_writer(request.out, sample_shape, dtype, request.writer_options, locate=row_locator(label),
                       extra_meta=meta) as writer:
        for start in range(0, len(features), rows):
            labels_chunk = np.asarray(labels[start : start + rows]).reshape(-1).astype(labels_dtype)
            writer.write(np.asarray(features[start : start + rows]), labels_chunk)


def _import_features(request: ImportRequest) -> None:
    """A features `.npy` alone: rows to predict."""
    source = request.source
    features = _load(source)
    sample_shape = sample_shape_of(source, features.shape, features.dtype, request.n_features)
    if len(features) == 0:
        raise DataError(f"{source}: holds no samples: the source is empty")
    rows = rows_per_chunk(sample_shape, features.dtype)
    with import_writer(request.out, sample_shape, stored_dtype(features.dtype), request.writer_options,
                       locate=row_locator(source), extra_meta=source_meta("npy", source), labeled=False) as writer:
        for start in range(0, len(features), rows):
            writer.write(np.asarray(features[start : start + rows]), None)


def _load(path: str) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise DataError(f"{path}: not a readable NumPy .npy file ({error})") from None


def _import_archive(request: ImportRequest) -> None:
    """Stream arrays `x` and `y` out of the archive, compressed or not, without loading them."""
    source = request.source
    try:
        with zipfile.ZipFile(source) as archive:
            names = set(archive.namelist())
            missing = [f"{name}.npy" for name in ("x", "y") if f"{name}.npy" not in names]
            if missing:
                held = ", ".join(sorted(name.removesuffix(".npy") for name in names)) or "nothing"
                raise DataError(f"{source}: a .npz import needs arrays 'x' and 'y'; it holds {held}")
            with archive.open("x.npy") as features_file, archive.open("y.npy") as labels_file:
                _copy_members(request, features_file, labels_file)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as error:
        raise DataError(f"{source}: cannot read the .npz archive: {error}") from None


def _copy_members(request: ImportRequest, features_file: IO[bytes], labels_file: IO[bytes]) -> None:
    """Check the headers of `x` and `y`, then hand their rows to the writer a chunk at a time."""
    source = request.source
    features_shape, features_dtype = _member_header(source, "x", features_file)
    labels_shape, labels_dtype = _member_header(source, "y", labels_file)
    sample_shape = sample_shape_of(f"{source} (x)", features_shape, features_dtype, request.n_features)
    labels_target = labels_dtype_of(f"{source} (y)", labels_shape, labels_dtype)
    if labels_shape[0] != features_shape[0]:
        raise DataError(f"{source}: x has {features_shape[0]} samples but y has {labels_shape[0]} labels")
    rows = rows_per_chunk(sample_shape, features_dtype)
    meta = source_meta("npz", source)
    dtype = stored_dtype(features_dtype)
    if features_shape[0] == 0:
        raise DataError(f"{source}: x holds no samples: the source is empty")
    locate = row_locator(f"{source} (y)")
    with import_writer(request.out, sample_shape, dtype, request.writer_options, locate=locate,
                       extra_meta=meta) as writer:
        for start in range(0, features_shape[0], rows):
            count = min(rows, features_shape[0] - start)
            features = _read_rows(source, "x", features_file, features_dtype, (count, *sample_shape))
            labels = _read_rows(source, "y", labels_file, labels_dtype, (count,))
            writer.write(features, labels.astype(labels_target))


def _member_header(source: str, name: str, handle: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    try:
        version = npy_format.read_magic(handle)
        if version == (1, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_1_0(handle)
        elif version == (2, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_2_0(handle)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except ValueError as error:
        raise DataError(f"{source}: array {name!r} is not a readable .npy member ({error})") from None
    if dtype.hasobject:
        raise DataError(f"{source}: array {name!r} holds Python objects; save numbers or text")
    if fortran_order and len(shape) > 1:
        # Rows of a column-major array are not contiguous, so it cannot be read a chunk at a time.
        raise DataError(f"{source}: array {name!r} is stored column-major; save np.ascontiguousarray({name})")
    return tuple(shape), dtype


def _read_rows(source: str, name: str, handle: IO[bytes], dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    size = math.prod(shape) * dtype.itemsize
    data = bytearray()
    while len(data) < size:
        block = handle.read(size - len(data))
        if not block:
            raise DataError(f"{source}: array {name!r} is truncated")
        data += block
    return np.frombuffer(data, dtype=dtype).reshape(shape)
