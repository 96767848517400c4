"""Import of a LIBSVM text file (`label index:value ...` per line, indices from 1), stored dense.

A first pass checks every line and learns the feature count (the largest index, unless
n_features fixes it) and the label type, so the second pass writes one consistent schema and
cannot fail on bad input. Each chunk of lines is parsed vectorised; only when that fails does a
line-by-line pass run, to name the bad line.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from shoal.data.encoding import Locate
from shoal.data.importers.common import ImportRequest, import_writer, rows_per_chunk, source_meta
from shoal.errors import DataError

LIBSVM_CHUNK_LINES = 20_000
LIBSVM_MAX_INDEX = 2**31 - 1  # rows are stored dense: a row this wide could not be written anyway


class Chunk:
    """The parsed rows of a run of LIBSVM lines, in sparse form."""

    def __init__(self, labels: np.ndarray, counts: np.ndarray, indices: np.ndarray, values: np.ndarray):
        self.labels = labels  # int64 when every label is an integer, else float64
        self.counts = counts  # pairs per row
        self.indices = indices  # 1-based
        self.values = values

    def dense(self, n_features: int) -> np.ndarray:
        features = np.zeros((len(self.labels), n_features), dtype=np.float32)
        rows = np.repeat(np.arange(len(self.labels)), self.counts)
        features[rows, self.indices - 1] = self.values
        return features


def import_file(request: ImportRequest) -> None:
    source = request.source
    features, integer_labels = _first_pass(source, request.n_features)
    chunk_lines = min(LIBSVM_CHUNK_LINES, rows_per_chunk((features,), np.dtype(np.float32)))
    meta = source_meta("libsvm", source)
    with import_writer(request.out, (features,), np.float32, request.writer_options, locate=_locator(source),
                       extra_meta=meta) as writer:
        for chunk in _chunks(source, features, chunk_lines):
            labels = chunk.labels if integer_labels else chunk.labels.astype(np.float64)
            writer.write(chunk.dense(features), labels)


def _first_pass(source: str, n_features: int | None) -> tuple[int, bool]:
    """Check every line; the feature count, and whether every label is an integer."""
    largest_index, integer_labels, rows = 0, True, 0
    for chunk in _chunks(source, n_features, LIBSVM_CHUNK_LINES):
        if len(chunk.indices):
            largest_index = max(largest_index, int(chunk.indices.max()))
        integer_labels = integer_labels and chunk.labels.dtype.kind == "i"
        rows += len(chunk.labels)
    if rows == 0:
        raise DataError(f"{source}: no data lines: the source is empty")
    features = n_features if n_features is not None else largest_index
    if features == 0:
        raise DataError(f"{source}: no feature appears on any line; pass n_features")
    return features, integer_labels


def _locator(source: str) -> Locate:
    """Names data row `row` (0-based; comments and blank lines hold none) as `file:line`."""

    def locate(row: int) -> str:
        with open(source, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                if line.split("#", 1)[0].strip():
                    if row == 0:
                        return f"{source}:{number}"
                    row -= 1
        return source

    return locate


def _chunks(source: str, n_features: int | None, chunk_lines: int) -> Iterator[Chunk]:
    """Parsed chunks of `chunk_lines` lines; a bad line raises `DataError` naming it."""
    try:
        with open(source, encoding="utf-8") as handle:
            first, lines = 1, []
            for number, line in enumerate(handle, 1):
                lines.append(line)
                if len(lines) == chunk_lines:
                    yield _parse(source, first, lines, n_features)
                    first, lines = number + 1, []
            if lines:
                yield _parse(source, first, lines, n_features)
    except UnicodeDecodeError as error:
        raise DataError(f"{source}: not UTF-8 text ({error.reason} at byte {error.start} of a block)") from None
    except OSError as error:
        raise DataError(f"{source}: cannot read: {error.strerror or error}") from None


def _parse(source: str, first: int, lines: list[str], n_features: int | None) -> Chunk:
    """Parse lines numbered from `first`: vectorised, with a line-by-line pass to name a bad line."""
    labels, counts, pairs = [], [], []
    for line in lines:
        if "#" in line:
            line = line[: line.index("#")]
        tokens = line.split()
        if tokens:
            labels.append(tokens[0])
            counts.append(len(tokens) - 1)
            pairs.append(" ".join(tokens[1:]))
    joined = " ".join(pair for pair in pairs if pair)
    try:
        if not _well_formed_pairs(joined, sum(counts)):
            raise ValueError("malformed pair")
        numbers = joined.replace(":", " ").split()
        # Python's int() and float() decide what a number is, here and in the line-by-line pass.
        indices = np.array(list(map(int, numbers[0::2])), dtype=np.int64)
        values = np.array(list(map(float, numbers[1::2])), dtype=np.float64)
        if len(indices) and (indices.min() < 1 or indices.max() > (n_features or LIBSVM_MAX_INDEX)):
            raise ValueError("index out of range")
        parsed_labels = _parse_labels(labels)
    except (ValueError, OverflowError):
        pass
    else:
        return Chunk(parsed_labels, np.array(counts, dtype=np.int64), indices, values.astype(np.float32))
    _raise_line_error(source, first, lines, n_features)
    # The line-by-line pass names the culprit; should it ever not, name the lines at least.
    raise DataError(f"{source}:{first}-{first + len(lines) - 1}: cannot parse these lines")


def _well_formed_pairs(joined: str, count: int) -> bool:
    """Whether `joined` is `count` space-separated `index:value` tokens, each with exactly one colon.

    Done on the bytes with numpy: separators must alternate space, colon, space, ... and no two
    may touch, which a per-token check in Python would spend most of the parse time on.
    """
    if count == 0:
        return True
    text = np.frombuffer(f" {joined} ".encode(), dtype=np.uint8)
    positions = np.flatnonzero((text == ord(" ")) | (text == ord(":")))
    separators = text[positions]
    return (
        len(separators) == 2 * count + 1
        and bool(np.all(separators[0::2] == ord(" ")))
        and bool(np.all(separators[1::2] == ord(":")))
        and bool(np.all(np.diff(positions) > 1))
    )


def _parse_labels(labels: list[str]) -> np.ndarray:
    """Integers when every label is one (`-1`, `+1`, `0`), else floats."""
    try:
        return np.array(list(map(int, labels)), dtype=np.int64)
    except (ValueError, OverflowError):
        return np.array(list(map(float, labels)), dtype=np.float64)


def _raise_line_error(source: str, first: int, lines: list[str], n_features: int | None) -> None:
    """Check lines one at a time and raise `DataError(file:line: what)` for the first bad one."""
    for number, line in enumerate(lines, first):
        if "#" in line:
            line = line[: line.index("#")]
        tokens = line.split()
        if not tokens:
            continue
        where = f"{source}:{number}"
        try:
            float(tokens[0])
        except ValueError:
            raise DataError(f"{where}: label {tokens[0]!r} is not a number (a line starts with its label)") from None
        for token in tokens[1:]:
            _check_pair(where, token, n_features)


def _check_pair(where: str, token: str, n_features: int | None) -> None:
    """Raise `DataError(where: what)` if `token` is not a valid `index:value` pair."""
    index_text, colon, value_text = token.partition(":")
    if not colon or not index_text or not value_text or ":" in value_text:
        raise DataError(f"{where}: malformed pair {token!r} (expected index:value)")
    try:
        index = int(index_text)
    except ValueError:
        raise DataError(f"{where}: index {index_text!r} is not an integer") from None
    if index < 1:
        raise DataError(f"{where}: index {index} is below 1 (LIBSVM indices start at 1)")
    if n_features is not None and index > n_features:
        raise DataError(f"{where}: index {index} is above the feature count {n_features}")
    if index > LIBSVM_MAX_INDEX:
        raise DataError(f"{where}: index {index} is above the largest supported, {LIBSVM_MAX_INDEX}")
    try:
        float(value_text)
    except ValueError:
        raise DataError(f"{where}: value {value_text!r} of index {index} is not a number") from None
