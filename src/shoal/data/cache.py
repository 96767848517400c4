"""A rank's share on local disk: written once from the store, memory-mapped, read many times.

A share larger than the worker's memory budget cannot be held in RAM (the Parallel SGD
paper's sub-partitions, cNeural's "load once, read many"). It is copied once, a bounded
number of rows at a time, into a local file. The loader reads it one sub-partition at a time
into buffers it reuses (positioned reads, so nothing of the file becomes resident beyond
them), and the worker's resident memory stays bounded by its budget. The file is also mapped
into memory, for random access to any row (`features`).

With a cache folder the files are kept, named by the dataset's fingerprint and the row
range: a later run on the unchanged dataset maps them instead of reading the store again.
Files are written under temporary names and a marker is written last, so a run that dies
while writing leaves nothing that a later run would mistake for a finished cache.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import tempfile
import uuid
import weakref

import numpy as np

from shoal.data.format import Dataset
from shoal.errors import DataError


class ShareCache:
    """Rows [start, stop) of a dataset as a read-only memory-mapped array plus in-memory labels."""

    def __init__(self, dataset: Dataset, start: int, stop: int, *, cache_dir: str | None, chunk_rows: int):
        self.rows = stop - start
        self.row_bytes = dataset.features * dataset.feature_dtype.itemsize
        self.keep = cache_dir is not None
        self.folder = cache_dir if cache_dir is not None else tempfile.mkdtemp(prefix="shoal-share-")
        if not self.keep:  # also on an error or sys.exit: a temporary cache never outlives the worker
            weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)
        try:
            os.makedirs(self.folder, exist_ok=True)
        except OSError as error:
            raise DataError(f"data.cache_dir: cannot create {self.folder}: {error}") from None
        name = f"share-{dataset.fingerprint()[:20]}-rows-{start}-{stop}"
        self.base = os.path.join(self.folder, name)
        self.reused = self.keep and self._complete(dataset)
        if not self.reused:
            self._write(dataset, start, stop, chunk_rows)
        self.labels = np.load(self.base + ".labels.npy")
        self._file = open(self.base + ".features", "rb")
        self._map: mmap.mmap | None = mmap.mmap(self._file.fileno(), self.rows * self.row_bytes,
                                                access=mmap.ACCESS_READ)
        self.features = np.frombuffer(self._map, dtype=dataset.feature_dtype).reshape(self.rows, *dataset.shape)

    def _marker(self, dataset: Dataset) -> dict:
        return {"rows": self.rows, "shape": list(dataset.shape), "dtype": dataset.feature_dtype.name}

    def _complete(self, dataset: Dataset) -> bool:
        try:
            with open(self.base + ".json") as handle:
                marker = json.load(handle)
            size = os.path.getsize(self.base + ".features")
        except (OSError, ValueError):
            return False
        return marker == self._marker(dataset) and size == self.rows * self.row_bytes

    def _write(self, dataset: Dataset, start: int, stop: int, chunk_rows: int) -> None:
        """Copy the rows from the store, at most `chunk_rows` at a time, then publish the marker."""
        suffix = f".{uuid.uuid4().hex[:8]}.tmp"
        labels = []
        try:
            with open(self.base + ".features" + suffix, "wb") as handle:
                for _, block, label in dataset.iter_rows(start, stop, max_rows=chunk_rows):
                    handle.write(np.ascontiguousarray(block).data)
                    labels.append(dataset.label_indices(label, dataset.path))
            indices = np.concatenate(labels) if labels else np.empty(0, np.int64)
            with open(self.base + ".labels.npy" + suffix, "wb") as handle:
                np.save(handle, indices)
            for part in (".features", ".labels.npy"):
                os.replace(self.base + part + suffix, self.base + part)
            with open(self.base + ".json" + suffix, "w") as handle:
                json.dump(self._marker(dataset), handle)
            os.replace(self.base + ".json" + suffix, self.base + ".json")
        except OSError as error:
            self._remove(suffix)
            raise DataError(f"{self.folder}: cannot write the local cache of the share: {error}") from None
        except BaseException:
            self._remove(suffix)
            raise

    def _remove(self, suffix: str) -> None:
        for part in (".features", ".labels.npy", ".json"):
            for path in (self.base + part + suffix, self.base + part):
                if os.path.exists(path):
                    os.remove(path)

    def read_into(self, lo: int, hi: int, out: np.ndarray) -> None:
        """Copy rows [lo, hi) into `out` with positioned reads: no page of the mapping becomes resident."""
        view = memoryview(out.reshape(-1)).cast("B")
        done, offset, total = 0, lo * self.row_bytes, (hi - lo) * self.row_bytes
        while done < total:
            count = os.preadv(self._file.fileno(), [view[done:total]], offset + done)
            if count <= 0:
                raise DataError(f"{self.base}.features: the cache file is shorter than expected")
            done += count

    def close(self) -> None:
        """Unmap the file; remove it unless it lives in a cache folder for later runs."""
        self.features = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a batch still refers to the map: the unmap happens when it goes
                pass
            self._map = None
        self._file.close()
        if not self.keep:
            shutil.rmtree(self.folder, ignore_errors=True)
