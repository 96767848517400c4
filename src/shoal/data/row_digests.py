"""Digests of a dataset's rows, block by block: how a machine that streams rows from another tells that they
are the rows stored there, not rows altered on the way or misread.

The rows are cut into blocks: every row group into runs of `block_rows` rows (about `BLOCK_BYTES` of
features; a row group's last run is shorter), so both sides know the blocks from the dataset's
meta.json alone. A block's digest is a SHA-256 of its features exactly as a reader gets them (the
stored numbers' bytes) and of its labels (numbers' bytes; text as lengths and bytes), the same however
the rows were cut into record batches. The data server takes the digests of its files once, when it
starts serving (`dataset_digests`); a reader asks for whole blocks, recomputes each block's digest
from what it received, and gives no row of a block until the block matches (`CheckedRows`).
SHA-256 runs at more than a gigabyte a second here: a block costs a fraction of its transfer.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from shoal.data.format import Dataset, column_values

BLOCK_BYTES = 256 * 2**10  # a block's features: the most a reader holds back, and twice the most a range adds
DIGEST_BYTES = 32


class RowsDiffer(Exception):
    """Rows [first, stop) of the dataset do not match their digest (`stop` == `first`: no digest fits them)."""

    def __init__(self, first: int, stop: int):
        super().__init__(f"rows {first + 1} to {stop}")
        self.first, self.stop = first, stop


def block_rows(dataset: Dataset) -> int:
    """Rows in a full block of `dataset`."""
    return max(1, BLOCK_BYTES // max(1, dataset.features * dataset.feature_dtype.itemsize))


def block_bounds(dataset: Dataset) -> np.ndarray:
    """Every block's first dataset row, then the dataset's row count: block k holds rows [bounds[k], bounds[k + 1])."""
    size, first, starts = block_rows(dataset), 0, []
    for info in dataset.files:
        for group_rows in info.row_groups:
            starts.append(np.arange(first, first + group_rows, size, dtype=np.int64))
            first += group_rows
    return np.concatenate([*starts, np.array([first], np.int64)])


def widened(bounds: np.ndarray, start: int, stop: int) -> tuple[int, int]:
    """The whole blocks that hold rows [start, stop)."""
    first = int(bounds[np.searchsorted(bounds, start, side="right") - 1])
    return first, int(bounds[np.searchsorted(bounds, stop, side="left")])


def starting(bounds: np.ndarray, start: int, stop: int) -> slice:
    """The blocks whose first row lies in [start, stop), as a slice of block numbers."""
    return slice(int(np.searchsorted(bounds[:-1], start)), int(np.searchsorted(bounds[:-1], stop)))


def label_bytes(labels: pa.Array) -> tuple[memoryview | np.ndarray, memoryview | bytes]:
    """A piece of labels as two byte strings whose concatenations over consecutive pieces do not depend on where
    the pieces were cut: numbers' bytes and nothing, or text's lengths and its bytes."""
    if labels.null_count:
        raise ValueError("the label column holds empty values")
    kind = labels.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return column_values(labels), b""
    if pa.types.is_boolean(kind):
        return np.asarray(labels.to_numpy(zero_copy_only=False), np.uint8), b""
    if not (pa.types.is_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_string(kind)
            or pa.types.is_large_binary(kind)):
        labels = labels.cast(pa.large_string())  # any other type, by its text
    width = 8 if pa.types.is_large_string(labels.type) or pa.types.is_large_binary(labels.type) else 4
    offsets = np.frombuffer(labels.buffers()[1], dtype=f"<i{width}", count=len(labels) + 1,
                            offset=labels.offset * width)
    text = labels.buffers()[2]
    data = memoryview(text)[offsets[0]:offsets[-1]] if text is not None else b""
    return np.diff(offsets).astype("<i8"), data


class BlockDigests:
    """The digests of consecutive blocks, fed consecutive rows from a block's first row on."""

    def __init__(self, bounds: np.ndarray, start: int):
        self.bounds = bounds
        self.block = int(np.searchsorted(bounds, start))
        if self.block >= len(bounds) or bounds[self.block] != start:
            raise ValueError(f"row {start} does not begin a block")
        self.position = start
        self._parts = self._fresh()

    @staticmethod
    def _fresh() -> list:
        return [hashlib.sha256() for _ in range(3)]  # features, label numbers or text lengths, label text

    @property
    def complete(self) -> int:
        """The first row not in a block already digested."""
        return int(self.bounds[self.block])

    def add(self, features: np.ndarray, labels: pa.Array) -> list[tuple[int, int, bytes]]:
        """Take the next rows (flat features and their labels); the blocks they complete: (first, stop, digest)."""
        done, at = [], 0
        while at < len(features):
            if self.block + 1 >= len(self.bounds):
                raise RowsDiffer(self.position, self.position)  # rows past the dataset's end
            first, stop = int(self.bounds[self.block]), int(self.bounds[self.block + 1])
            take = min(len(features) - at, stop - self.position)
            numbers, text = label_bytes(labels.slice(at, take))
            for part, value in zip(self._parts, (np.ascontiguousarray(features[at:at + take]), numbers, text),
                                   strict=True):
                part.update(value)
            at, self.position = at + take, self.position + take
            if self.position == stop:
                done.append((first, stop, hashlib.sha256(b"".join(p.digest() for p in self._parts)).digest()))
                self.block, self._parts = self.block + 1, self._fresh()
        return done


def dataset_digests(bounds: np.ndarray, pieces: Iterable[tuple[np.ndarray, pa.Array]]) -> bytes:
    """Every block's digest, one after another, of a dataset read whole in `pieces` (flat features, labels)."""
    blocks = BlockDigests(bounds, 0)
    try:
        digests = [digest for features, labels in pieces for _, _, digest in blocks.add(features, labels)]
    except RowsDiffer:
        raise ValueError(f"the files hold more rows than the {bounds[-1]} meta.json lists") from None
    if blocks.block != len(bounds) - 1:
        raise ValueError(f"the files hold {blocks.position} rows, not the {bounds[-1]} meta.json lists")
    return b"".join(digests)


class CheckedRows:
    """Rows of one stream held back until the blocks that hold them match the digests the server sent.

    The stream begins at a block's first row; each piece of rows comes with the digests of the blocks
    that begin in it (`starting`). `add` raises `RowsDiffer` for a block that does not match, and
    gives the pieces of rows all of whose blocks matched: (dataset row, flat features, labels).
    """

    def __init__(self, bounds: np.ndarray, start: int):
        self._blocks = BlockDigests(bounds, start)
        self._expected: deque[bytes] = deque()
        self._held: deque[tuple[int, np.ndarray, np.ndarray]] = deque()
        self.position = start

    def add(self, features: np.ndarray, labels: pa.Array, digests: Sequence[bytes]) -> Iterator[
            tuple[int, np.ndarray, np.ndarray]]:
        span = starting(self._blocks.bounds, self.position, self.position + len(features))
        if len(digests) != span.stop - span.start:
            raise RowsDiffer(self.position, self.position + len(features))
        self._expected.extend(digests)
        for first, stop, digest in self._blocks.add(features, labels):
            if digest != self._expected.popleft():
                raise RowsDiffer(first, stop)
        self._held.append((self.position, features, column_values(labels)))
        self.position += len(features)
        return self._release(self._blocks.complete)

    def _release(self, verified: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        released = []
        while self._held and self._held[0][0] < verified:
            row, features, labels = self._held.popleft()
            cut = verified - row
            if cut < len(features):
                self._held.appendleft((verified, features[cut:], labels[cut:]))
                features, labels = features[:cut], labels[:cut]
            released.append((row, features, labels))
        return iter(released)
