"""shoal data synth sequences: the same bytes per seed, the shape, and classes that follow the pulses' order."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.cli import main
from shoal.data.sequences import CLASSES, _task_channels, synth_sequences
from shoal.errors import DataError
from tests.unit.data.test_synthetic import folder_bytes


def test_a_seed_gives_the_same_bytes_and_another_seed_other_rows(tmp_path):
    first = synth_sequences(str(tmp_path / "a"), 30_000, seed=5)
    again = synth_sequences(str(tmp_path / "b"), 30_000, seed=5)
    other = synth_sequences(str(tmp_path / "c"), 30_000, seed=6)
    assert folder_bytes(tmp_path / "a") == folder_bytes(tmp_path / "b")  # two chunks of rows, each its own stream
    assert not np.array_equal(first.read_rows(0, 100)[0], other.read_rows(0, 100)[0])
    assert first.rows == again.rows == 30_000 and first.classes == [0, 1, 2]
    assert first.shape == (20, 4) and first.read_rows(0, 1)[0].dtype == np.float32


def test_the_class_is_which_pulse_comes_first(tmp_path):
    dataset = synth_sequences(str(tmp_path / "s"), 3_000, length=12, features=5, seed=1, task_seed=7)
    sequences, labels = dataset.read_all()
    assert sequences.shape == (3_000, 12, 5)
    assert np.bincount(labels, minlength=CLASSES).min() > 900  # equally likely classes
    first, second = _task_channels(5, 7)
    peaks = sequences[:, :, first].argmax(axis=1), sequences[:, :, second].argmax(axis=1)
    told = np.select([peaks[0] < peaks[1], peaks[0] > peaks[1]], [0, 1], default=2)
    # the noise moves a peak by a step now and then (mostly class 2's, whose pulses share one): 0.886 here
    assert (told == labels).mean() > 0.85
    quiet = [channel for channel in range(5) if channel not in (first, second)]
    # a row's highest value: a pulse (1 to 2, plus noise) on the two channels, noise alone on the others
    assert sequences[:, :, [first, second]].max(axis=1).mean() > 1.4 > 1.0 > sequences[:, :, quiet].max(axis=1).mean()


def test_bad_arguments_name_what_was_given(tmp_path, capsys):
    with pytest.raises(DataError, match="length must be an integer of at least 4, got 2"):
        synth_sequences(str(tmp_path / "s"), 10, length=2)
    with pytest.raises(DataError, match="features must be an integer of at least 2, got 1"):
        synth_sequences(str(tmp_path / "s"), 10, features=1)
    assert main(["data", "synth", "digits", "--rows", "5", "--length", "8", "--out", str(tmp_path / "d")]) == 2
    assert "--length 8: only sequences rows have a length" in capsys.readouterr().err
    assert not (tmp_path / "d").exists() and not (tmp_path / "s").exists()
