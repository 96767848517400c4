"""Synthetic sequences of three classes told apart by order in time: mpi_learn's LSTM workload, made by a command.

mpi_learn trained an LSTM of 20 units and a softmax of 3 classes on sequences of particle features.
`synth_sequences` poses a task of that shape whose class lies in the order of events, not in any one
step: each row is `length` steps of `features` channels of noise; two of the channels (fixed by `task_seed`)
each carry one pulse, at random steps. Class 0: the first channel's pulse comes earlier; class 1: the
second's; class 2: both at the same step. Pulse heights vary by row, so no single step, channel or sum
tells the class (on 6,000 rows, examples/sequences-lstm.toml's LSTM reached 0.94 test accuracy in 3
epochs, a dense network of 64 units on the flattened rows 0.89 in 6). Rows are drawn as
`shoal.data.synthetic`'s are: fixed-size chunks, each from its own generator, so a seed gives the same
bytes on any machine.
"""

from __future__ import annotations

import functools

import numpy as np

from shoal.data.format import Dataset, DatasetWriter, open_dataset
from shoal.data.synthetic import _check_arguments, _chunks, _drawn_ahead, _source_meta
from shoal.errors import DataError

CHUNK_ROWS = 20_000
CLASSES = 3
NOISE = 0.3  # standard deviation of every step's noise, against pulses of height 1 to 2
PULSE_WIDTH = 1.0  # the pulse's standard deviation in steps
_SEQUENCES_TASK_KEY = 4  # a spawn key of its own (synthetic.py uses 1 and 2, claims.py 3)


def synth_sequences(out: str, rows: int, *, length: int = 20, features: int = 4, seed: int = 0, task_seed: int = 0,
                    overwrite: bool = False) -> Dataset:
    """Rows of shape (length, features), float32, labels 0, 1, 2 (equally likely): which pulse comes first."""
    _check_arguments(out, rows, seed, task_seed)
    for name, value, least in (("length", length, 4), ("features", features, 2)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise DataError(f"{out}: {name} must be an integer of at least {least}, got {value!r}")
    channels = _task_channels(features, task_seed)
    meta = _source_meta("sequences", rows, seed, task_seed, length=int(length), features=int(features))
    options = {"extra_meta": meta, "overwrite": overwrite, "classes": list(range(CLASSES))}
    with DatasetWriter(out, (length, features), np.float32, **options) as writer:
        draw = functools.partial(_draw_sequences, length=length, features=features, channels=channels)
        for sequences, labels in _drawn_ahead(draw, seed, _chunks(rows, CHUNK_ROWS), CHUNK_ROWS):
            writer.write(sequences, labels)
    return open_dataset(out)


def _task_channels(features: int, task_seed: int) -> tuple[int, int]:
    """The two channels that carry the pulses."""
    generator = np.random.default_rng(np.random.SeedSequence(task_seed, spawn_key=(_SEQUENCES_TASK_KEY,)))
    first, second = generator.choice(features, size=2, replace=False)
    return int(first), int(second)


def _draw_sequences(generator: np.random.Generator, count: int, *, length: int, features: int,
                    channels: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    labels = generator.integers(0, CLASSES, size=count)
    # the earlier step leaves at least one step after it; class 2 puts both pulses at the earlier step
    early = generator.integers(0, length - 1, size=count)
    late = early + 1 + (generator.random(count) * (length - 1 - early)).astype(np.int64)
    first_at = np.where(labels == 1, late, early)
    second_at = np.where(labels == 0, late, early)
    steps = np.arange(length)[None, :]
    sequences = generator.normal(0.0, NOISE, size=(count, length, features)).astype(np.float32)
    for channel, at in zip(channels, (first_at, second_at)):
        height = generator.uniform(1.0, 2.0, size=(count, 1))
        sequences[:, :, channel] += (height * np.exp(-0.5 * ((steps - at[:, None]) / PULSE_WIDTH) ** 2)).astype(
            np.float32)
    return sequences, labels.astype(np.int64)
