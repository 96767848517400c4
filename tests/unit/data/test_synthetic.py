"""Synthetic generators: byte-identical output per seed, shapes and balance, and learnability."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from shoal.data import synthetic
from shoal.data.synthetic import synth_binary, synth_digits
from shoal.errors import DataError


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


@pytest.fixture
def one_thread():
    """Train on one thread: tiny networks gain nothing from more, and lose a lot on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def train_mlp(
    x: np.ndarray, y: np.ndarray, hidden: int, activation: type[torch.nn.Module], steps: int
) -> torch.nn.Module:
    """A one-hidden-layer network fitted full-batch with Adam: quick, and deterministic on CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(x.shape[1], hidden), activation(), torch.nn.Linear(hidden, int(y.max()) + 1)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(dim=1).numpy() == y).mean())


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few thousand rows, so that a quick test still spans several chunks."""
    monkeypatch.setattr(synthetic, "CHUNK_ROWS", 4_000)
    monkeypatch.setattr(synthetic, "DIGITS_CHUNK_ROWS", 2_000)


BINARY_ROWS = 10_000
DIGITS_ROWS = 5_000


def test_binary_same_seed_gives_identical_bytes(tmp_path, small_chunks):
    first = synth_binary(str(tmp_path / "first"), BINARY_ROWS, seed=3, task_seed=4)
    synth_binary(str(tmp_path / "second"), BINARY_ROWS, seed=3, task_seed=4)
    assert folder_bytes(tmp_path / "first") == folder_bytes(tmp_path / "second")
    other = synth_binary(str(tmp_path / "other"), BINARY_ROWS, seed=5, task_seed=4)
    assert not np.array_equal(first.read_rows(0, 100)[0], other.read_rows(0, 100)[0])


def test_binary_shape_balance_and_meta(tmp_path):
    dataset = synth_binary(str(tmp_path / "binary"), BINARY_ROWS, features=16, seed=1, task_seed=2)
    assert dataset.rows == BINARY_ROWS
    assert dataset.shape == (16,) and dataset.feature_dtype == np.float32
    assert dataset.classes == [0, 1]
    assert dataset.meta["source"] == {
        "generator": "binary",
        "version": synthetic.GENERATOR_VERSION,
        "rows": BINARY_ROWS,
        "seed": 1,
        "task_seed": 2,
        "features": 16,
    }
    features, labels = dataset.read_all()
    assert 0.25 < labels.mean() < 0.38
    assert abs(features.mean()) < 0.02 and abs(features.std() - 1) < 0.02


def test_binary_task_depends_on_task_seed_only():
    x = np.random.default_rng(0).standard_normal((5_000, 32)).astype(np.float32)
    same = synthetic._BinaryTeacher(32, 7).positive(x) == synthetic._BinaryTeacher(32, 7).positive(x)
    other = synthetic._BinaryTeacher(32, 7).positive(x) == synthetic._BinaryTeacher(32, 8).positive(x)
    assert same.all()
    assert other.mean() < 0.75


def test_binary_is_learnable_and_not_linear(tmp_path, one_thread):
    # Train and test sets from different seeds share the task through task_seed.
    train_x, train_y = synth_binary(str(tmp_path / "train"), 8_000, seed=1).read_all()
    test_x, test_y = synth_binary(str(tmp_path / "test"), 4_000, seed=2).read_all()
    majority = max(test_y.mean(), 1 - test_y.mean())
    linear = LogisticRegression().fit(train_x, train_y).score(test_x, test_y)
    assert linear > majority + 0.05
    network = accuracy(train_mlp(train_x, train_y, 64, torch.nn.ReLU, 200), test_x, test_y)
    assert linear + 0.02 < network < 0.97


def test_digits_same_seed_gives_identical_bytes_and_whole_chunks_are_prefixes(tmp_path, small_chunks):
    synth_digits(str(tmp_path / "first"), DIGITS_ROWS, seed=3)
    synth_digits(str(tmp_path / "second"), DIGITS_ROWS, seed=3)
    assert folder_bytes(tmp_path / "first") == folder_bytes(tmp_path / "second")
    # Rows come in fixed chunks, so a shorter run is a prefix of a longer one at chunk ends.
    whole = 2 * synthetic.DIGITS_CHUNK_ROWS
    prefix = synth_digits(str(tmp_path / "prefix"), whole, seed=3).read_all()
    longer = synth_digits(str(tmp_path / "first"), DIGITS_ROWS, seed=3, overwrite=True).read_rows(0, whole)
    np.testing.assert_array_equal(prefix[0], longer[0])
    np.testing.assert_array_equal(prefix[1], longer[1])


def test_digits_shape_balance_and_meta(tmp_path):
    dataset = synth_digits(str(tmp_path / "digits"), DIGITS_ROWS, seed=1, task_seed=2)
    assert dataset.shape == (28, 28) and dataset.feature_dtype == np.uint8
    assert dataset.classes == list(range(10))
    assert dataset.meta["source"]["generator"] == "digits"
    assert dataset.meta["source"]["seed"] == 1 and dataset.meta["source"]["task_seed"] == 2
    images, labels = dataset.read_all()
    counts = np.bincount(labels, minlength=10) / len(labels)
    assert counts.min() > 0.08 and counts.max() < 0.12
    # Dark background, bright strokes, like MNIST.
    assert 10 < images.mean() < 60 and images.max() == 255
    assert np.median(images[:, :3, :]) < 20


def test_digits_are_learnable_but_not_trivially(tmp_path, one_thread):
    train = synth_digits(str(tmp_path / "train"), 6_000, seed=1).read_all()
    test = synth_digits(str(tmp_path / "test"), 2_000, seed=2).read_all()
    train_x = train[0].reshape(len(train[0]), -1).astype(np.float32) / 255
    test_x = test[0].reshape(len(test[0]), -1).astype(np.float32) / 255
    network = accuracy(train_mlp(train_x, train[1], 40, torch.nn.Sigmoid, 100), test_x, test[1])
    assert 0.8 < network < 0.99


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"rows": 0}, "rows must be an integer of at least 1, got 0"),
        ({"rows": 10, "seed": -1}, "seed must be an integer of at least 0, got -1"),
        ({"rows": 10, "task_seed": 1.5}, "task_seed must be an integer of at least 0, got 1.5"),
    ],
)
@pytest.mark.parametrize("generator", [synth_binary, synth_digits])
def test_bad_arguments_leave_nothing(tmp_path, generator, arguments, problem):
    out = tmp_path / "out"
    with pytest.raises(DataError, match=f"^{out}: {problem}$"):
        generator(str(out), **arguments)
    assert os.listdir(tmp_path) == []
