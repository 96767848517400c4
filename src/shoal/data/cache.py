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

Nothing is left behind however the worker ends. Cleanup on the way out does not run when a
worker is killed (SIGKILL, or `os._exit` after a stop signal, or a restart), so:
- without a cache folder, the rows go to a file that has no name from the start (created and
  unlinked at once): the kernel frees it with the process, whatever ends it. Its folder (named
  by its owner, empty) is removed at `close`, or by the next share cache on the machine once
  the owner is gone;
- in a cache folder, the temporary names carry their owner, and the next share cache in that
  folder removes those whose owner is gone (`shoal.data.leftovers`).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import tempfile
import weakref
from typing import IO

import numpy as np

from shoal.data import leftovers
from shoal.data.format import Dataset
from shoal.durable import replace_durably
from shoal.errors import DataError

TEMPORARY_STEM = "shoal-share"  # the folder of a cache without a cache folder, in the temporary folder
KEPT_PREFIX = "share-"
PARTS = (".features", ".labels.npy", ".json")


class ShareCache:
    """Rows [start, stop) of a dataset as a read-only memory-mapped array plus in-memory labels."""

    def __init__(self, dataset: Dataset, start: int, stop: int, *, cache_dir: str | None, chunk_rows: int):
        self.rows = stop - start
        self.row_bytes = dataset.features * dataset.feature_dtype.itemsize
        self.keep = cache_dir is not None
        if self.keep:
            self.folder = cache_dir
            self._make_kept_folder()
        else:
            self.folder = os.path.join(tempfile.gettempdir(), leftovers.owned_name(TEMPORARY_STEM))
            self._make_temporary_folder()
        name = f"{KEPT_PREFIX}{dataset.fingerprint()[:20]}-rows-{start}-{stop}"
        self.base = os.path.join(self.folder, name)
        self.reused = self.keep and self._complete(dataset)
        if not self.keep:
            self._file, self.labels = self._copy_unnamed(dataset, start, stop, chunk_rows)
        else:
            if not self.reused:
                self._write(dataset, start, stop, chunk_rows)
            self.labels = np.load(self.base + ".labels.npy")
            self._file = open(self.base + ".features", "rb")
        self._map: mmap.mmap | None = mmap.mmap(self._file.fileno(), self.rows * self.row_bytes,
                                                access=mmap.ACCESS_READ)
        self.features = np.frombuffer(self._map, dtype=dataset.feature_dtype).reshape(self.rows, *dataset.shape)

    def _make_kept_folder(self) -> None:
        try:
            os.makedirs(self.folder, exist_ok=True)
        except OSError as error:
            raise DataError(f"data.cache_dir: cannot create {self.folder}: {error}") from None
        leftovers.sweep(self.folder, KEPT_PREFIX)  # what killed workers were writing

    def _make_temporary_folder(self) -> None:
        leftovers.sweep(tempfile.gettempdir(), f"{TEMPORARY_STEM}.")
        try:
            os.mkdir(self.folder, 0o700)
        except OSError as error:
            raise DataError(f"{self.folder}: cannot create the local cache of the share: {error}") from None
        # also on an error or sys.exit; a kill leaves the folder, empty, to the next sweep
        weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)

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

    def _copy(self, dataset: Dataset, start: int, stop: int, chunk_rows: int, handle: IO[bytes]) -> np.ndarray:
        """Write the features of rows [start, stop) to `handle`, `chunk_rows` at a time; their class indices.

        The rows are trained on: a NaN or infinity is a `DataError` naming its file and row.
        """
        labels = []
        for _, block, label in dataset.iter_rows(start, stop, max_rows=chunk_rows, finite=True):
            handle.write(np.ascontiguousarray(block).data)
            labels.append(dataset.label_indices(label, dataset.path))
        return np.concatenate(labels) if labels else np.empty(0, np.int64)

    def _copy_unnamed(self, dataset: Dataset, start: int, stop: int, chunk_rows: int) -> tuple[IO[bytes], np.ndarray]:
        """The rows copied into a file without a name, open for reading, and their labels."""
        handle = None
        try:
            handle = tempfile.TemporaryFile(dir=self.folder)
            labels = self._copy(dataset, start, stop, chunk_rows, handle)
            handle.flush()
        except BaseException as error:
            if handle is not None:
                handle.close()
            if isinstance(error, OSError):
                raise DataError(f"{self.folder}: cannot write the local cache of the share: {error}") from None
            raise
        return handle, labels

    def _write(self, dataset: Dataset, start: int, stop: int, chunk_rows: int) -> None:
        """Copy the rows from the store into the cache folder, then publish the marker, last and durably."""
        temporary = {part: leftovers.owned_name(self.base + part) for part in PARTS}
        try:  # each temporary made new ("x"): never a file or link planted under its name
            with open(temporary[".features"], "xb") as handle:
                labels = self._copy(dataset, start, stop, chunk_rows, handle)
            with open(temporary[".labels.npy"], "xb") as handle:
                np.save(handle, labels)
            for part in (".features", ".labels.npy"):
                replace_durably(temporary[part], self.base + part)
            with open(temporary[".json"], "x") as handle:
                json.dump(self._marker(dataset), handle)
            replace_durably(temporary[".json"], self.base + ".json")
        except OSError as error:
            self._remove(temporary)
            reason = error.strerror or error  # not the temporary's name
            raise DataError(f"{self.folder}: cannot write the local cache of the share: {reason}") from None
        except BaseException:
            self._remove(temporary)
            raise

    def _remove(self, temporary: dict[str, str]) -> None:
        for part, path in temporary.items():
            for victim in (path, self.base + part):
                if os.path.exists(victim):
                    os.remove(victim)

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
