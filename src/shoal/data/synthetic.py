"""Synthetic datasets: learnable tasks of any size, for tests, demos and scaling benchmarks.

Each generator draws rows in chunks of a fixed size, chunk `i` from its own generator
seeded by `SeedSequence([seed, i])`, so a given seed gives byte-identical output whatever the
machine's memory and however the writer groups rows. The task itself (the teacher network, the
digit strokes) comes from `task_seed` alone, so a train set (seed=1) and a test set (seed=2)
drawn with one `task_seed` pose the same problem.
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from shoal.data.format import Dataset, DatasetWriter, open_dataset
from shoal.errors import DataError

CHUNK_ROWS = 50_000
DIGITS_CHUNK_ROWS = 10_000  # images take float32 work space: 31 MB per 10,000
ROW_GROUP_ROWS = 65_536  # rows per Parquet row group: the writer works in bursts of this many
GENERATOR_VERSION = 1  # bump when a generator's output for a given seed changes

# The task streams are children of `task_seed` (a spawn key), so they never coincide with a
# chunk stream `SeedSequence([seed, chunk])`.
_BINARY_TASK_KEY = 1
_DIGITS_TASK_KEY = 2

# synth_binary: a ReLU teacher with HIDDEN units whose linear part is replaced by a fixed amount
# LINEAR_WEIGHT of one direction, so a linear model does clearly worse than a small MLP
# (about 0.77 against 0.91 test accuracy, with 30% positives) whatever the task seed.
HIDDEN = 8
LINEAR_WEIGHT = 1.0
POSITIVE_RATE = 0.3
LABEL_NOISE = 0.05
CALIBRATION_ROWS = 100_000

# synth_digits: each class is a set of strokes from a shared pool; a sample drops some of its
# strokes, may gain a stray one, and is shifted, dimmed and blurred with noise.
IMAGE_SIDE = 28
CLASSES = 10
STROKES = 12
STROKES_PER_CLASS = 3
PEN_WIDTH = 1.1  # standard deviation of the soft pen, in pixels
MAX_SHIFT = 2
DROP_STROKE = 0.08
STRAY_STROKE = 0.02
NOISE_LEVEL = 50.0  # noise is triangular on +-NOISE_LEVEL grey levels (standard deviation NOISE_LEVEL / sqrt(6))


def synth_binary(
    out: str, rows: int, *, features: int = 32, seed: int = 0, task_seed: int = 0, overwrite: bool = False
) -> Dataset:
    """Gaussian features labelled 0/1 by a fixed random teacher network, with 5% of labels flipped."""
    _check_arguments(out, rows, seed, task_seed)
    if not isinstance(features, (int, np.integer)) or features < 1:
        raise DataError(f"{out}: features must be an integer of at least 1, got {features!r}")
    teacher = _binary_teacher(features, task_seed)
    meta = _source_meta("binary", rows, seed, task_seed, features=features)
    options = {"extra_meta": meta, "overwrite": overwrite}
    with DatasetWriter(out, (features,), np.float32, **options) as writer:
        draw = functools.partial(_draw_binary, teacher=teacher, features=features)
        for x, labels in _drawn_ahead(draw, seed, _chunks(rows, CHUNK_ROWS), CHUNK_ROWS):
            writer.write(x, labels)
    return open_dataset(out)


def _draw_binary(
    generator: np.random.Generator, count: int, *, teacher: _BinaryTeacher, features: int
) -> tuple[np.ndarray, np.ndarray]:
    x = generator.standard_normal((count, features), dtype=np.float32)
    flip = generator.random(count) < LABEL_NOISE
    return x, (teacher.positive(x) ^ flip).astype(np.int64)


@functools.lru_cache(maxsize=4)
def _binary_teacher(features: int, task_seed: int) -> _BinaryTeacher:
    """Built once per task: a train and a test set made in one process share the calibration."""
    return _BinaryTeacher(features, task_seed)


class _BinaryTeacher:
    """score(x) = relu(x W + b) v with its best linear fit removed, plus a set linear term."""

    def __init__(self, features: int, task_seed: int):
        generator = np.random.default_rng(np.random.SeedSequence(task_seed, spawn_key=(_BINARY_TASK_KEY,)))
        self.weights = generator.standard_normal((features, HIDDEN)) / np.sqrt(features)
        self.biases = generator.standard_normal(HIDDEN) * 0.5
        # Output weights of alternating sign: a monotone teacher would be nearly linear.
        self.outputs = np.abs(generator.standard_normal(HIDDEN)) * np.where(np.arange(HIDDEN) % 2 == 0, 1.0, -1.0)
        direction = generator.standard_normal(features)
        self.direction = direction / np.linalg.norm(direction)
        calibration = generator.standard_normal((CALIBRATION_ROWS, features))
        raw = self._raw(calibration)
        # The least-squares linear fit, by the normal equations (an SVD-based lstsq is far slower).
        self.linear = np.linalg.solve(calibration.T @ calibration, calibration.T @ (raw - raw.mean()))
        self.scale = float(np.std(raw - calibration @ self.linear))
        self.threshold = float(np.quantile(self.score(calibration), 1.0 - POSITIVE_RATE))

    def _raw(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(x @ self.weights + self.biases, 0.0) @ self.outputs

    def score(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        nonlinear = (self._raw(x) - x @ self.linear) / self.scale
        return nonlinear + LINEAR_WEIGHT * (x @ self.direction)

    def positive(self, x: np.ndarray) -> np.ndarray:
        return self.score(x) > self.threshold


def synth_digits(out: str, rows: int, *, seed: int = 0, task_seed: int = 0, overwrite: bool = False) -> Dataset:
    """MNIST-shaped 28x28 uint8 images of 10 stroke-drawn classes, labels 0..9."""
    _check_arguments(out, rows, seed, task_seed)
    strokes, masks = _digit_task(task_seed)
    shape = (IMAGE_SIDE, IMAGE_SIDE)
    meta = _source_meta("digits", rows, seed, task_seed)
    options = {"extra_meta": meta, "overwrite": overwrite}
    with DatasetWriter(out, shape, np.uint8, **options) as writer:
        draw = functools.partial(_draw_digits, strokes=strokes, masks=masks)
        for images, labels in _drawn_ahead(draw, seed, _chunks(rows, DIGITS_CHUNK_ROWS), DIGITS_CHUNK_ROWS):
            writer.write(images, labels)
    return open_dataset(out)


def _digit_task(task_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The stroke pool, shifted every way: (shifts, STROKES, 784) float32, and class masks (CLASSES, STROKES)."""
    generator = np.random.default_rng(np.random.SeedSequence(task_seed, spawn_key=(_DIGITS_TASK_KEY,)))
    # Each stroke is a quadratic Bezier curve inside the central 14x14 pixels, drawn with a soft pen.
    control = generator.uniform(7.0, 21.0, size=(STROKES, 3, 2))
    t = np.linspace(0.0, 1.0, 48)[None, :, None]
    points = (1 - t) ** 2 * control[:, None, 0] + 2 * (1 - t) * t * control[:, None, 1] + t**2 * control[:, None, 2]
    rows, columns = np.mgrid[0:IMAGE_SIDE, 0:IMAGE_SIDE]
    pixels = np.stack([rows.ravel(), columns.ravel()], axis=1).astype(np.float64)
    distance = ((pixels[None, :, None, :] - points[:, None, :, :]) ** 2).sum(axis=-1).min(axis=-1)
    # Multiples of 1/256, so that sums of strokes times weights in multiples of 1/64 are exact in
    # float32 and images do not depend on the order a BLAS library adds them in.
    pool = np.round(np.exp(-distance / (2 * PEN_WIDTH**2)) * 256) / 256
    pool = pool.reshape(STROKES, IMAGE_SIDE, IMAGE_SIDE)
    shifted = []
    for down, right in itertools.product(range(-MAX_SHIFT, MAX_SHIFT + 1), repeat=2):
        moved = np.zeros_like(pool)
        moved[:, max(down, 0) : IMAGE_SIDE + min(down, 0), max(right, 0) : IMAGE_SIDE + min(right, 0)] = pool[
            :, max(-down, 0) : IMAGE_SIDE - max(down, 0), max(-right, 0) : IMAGE_SIDE - max(right, 0)
        ]
        shifted.append(moved.reshape(STROKES, -1))
    # Classes share at most one stroke, so each differs from every other in at least four.
    masks: list[np.ndarray] = []
    while len(masks) < CLASSES:
        for _ in range(1000):
            candidate = np.zeros(STROKES, dtype=bool)
            candidate[generator.choice(STROKES, STROKES_PER_CLASS, replace=False)] = True
            if all((candidate & mask).sum() <= 1 for mask in masks):
                masks.append(candidate)
                break
        else:
            masks = []  # a dead end: start the greedy choice again
    return np.stack(shifted).astype(np.float32), np.stack(masks).astype(np.float32)


def _draw_digits(
    generator: np.random.Generator, count: int, *, strokes: np.ndarray, masks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    labels = generator.integers(0, CLASSES, size=count)
    member = masks[labels]
    kept = member * (generator.random((count, STROKES), dtype=np.float32) >= DROP_STROKE)
    stray = (1 - member) * (generator.random((count, STROKES), dtype=np.float32) < STRAY_STROKE)
    pressure = generator.uniform(0.7, 1.1, size=(count, STROKES)).astype(np.float32)
    weights = np.round((kept + stray) * pressure * 64) / 64
    shift = generator.integers(0, len(strokes), size=count)
    contrast = generator.uniform(0.75 * 255, 255, size=(count, 1)).astype(np.float32)
    # Triangular noise from two random bytes: Gaussian draws would cost more than the rest together.
    pixels = strokes.shape[-1]
    noise = generator.integers(0, 256, size=(count, pixels), dtype=np.uint8).astype(np.float32)
    noise += generator.integers(0, 256, size=(count, pixels), dtype=np.uint8)
    images = np.empty((count, strokes.shape[-1]), dtype=np.float32)
    # One matrix product per shift over the rows that have it: no per-sample Python work. einsum
    # without optimize stays out of BLAS, whose threads only wait on each other for products this
    # small (four times slower on a busy machine), while the writer has the other core anyway.
    order = np.argsort(shift, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(shift, minlength=len(strokes)))])
    for index in range(len(strokes)):
        rows = order[bounds[index] : bounds[index + 1]]
        images[rows] = np.einsum("rs,sp->rp", weights[rows], strokes[index], optimize=False)
    np.minimum(images, 1.0, out=images)
    images *= contrast
    noise -= 255
    noise *= NOISE_LEVEL / 255
    images += noise
    np.clip(images, 0, 255, out=images)
    return images.astype(np.uint8), labels.astype(np.int64)


def _check_arguments(out: str, rows: int, seed: int, task_seed: int) -> None:
    for name, value, least in (("rows", rows, 1), ("seed", seed, 0), ("task_seed", task_seed, 0)):
        if not isinstance(value, (int, np.integer)) or value < least:
            raise DataError(f"{out}: {name} must be an integer of at least {least}, got {value!r}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise DataError(f"{out}: exists and is not a folder")


def _chunks(rows: int, chunk_rows: int) -> list[tuple[int, int]]:
    """(chunk index, row count) pairs: fixed-size chunks, so output does not depend on memory."""
    return [(chunk, min(chunk_rows, rows - start)) for chunk, start in enumerate(range(0, rows, chunk_rows))]


def _chunk_generator(seed: int, chunk: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, chunk]))


def _drawn_ahead(
    draw: Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]],
    seed: int,
    chunks: list[tuple[int, int]],
    chunk_rows: int,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`draw` each chunk, in order, in a thread that keeps a row group's worth of chunks ready.

    The writer does its work in bursts, one Parquet row group (`ROW_GROUP_ROWS`) at a time, and
    numpy and Parquet both release the GIL, so drawing the next row group overlaps writing the
    last on a second core. Each chunk has its own generator: the output is as if drawn in turn.
    """
    ahead = -(-ROW_GROUP_ROWS // chunk_rows) + 1
    with ThreadPoolExecutor(max_workers=1) as executor:
        pending: collections.deque[Future] = collections.deque()
        for chunk, count in chunks:
            pending.append(executor.submit(draw, _chunk_generator(seed, chunk), count))
            if len(pending) > ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _source_meta(generator: str, rows: int, seed: int, task_seed: int, **more: Any) -> dict[str, Any]:
    return {
        "source": {
            "generator": generator,
            "version": GENERATOR_VERSION,
            "rows": rows,
            "seed": int(seed),
            "task_seed": int(task_seed),
            **more,
        }
    }
