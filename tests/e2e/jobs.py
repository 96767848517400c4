"""Small datasets and job files for the command-line tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shoal.data.format import DatasetWriter

FEATURES = 20


def write_task(folder: Path, rows: int = 6000, test_rows: int = 1000) -> tuple[Path, Path]:
    """A learnable two-class task: train and test datasets."""
    generator = np.random.default_rng(0)
    paths = []
    for name, count in (("train", rows), ("test", test_rows)):
        features = generator.normal(size=(count, FEATURES)).astype(np.float32)
        labels = np.where(features[:, 0] * features[:, 1] + features[:, 2] > 0, "yes", "no")
        with DatasetWriter(str(folder / name), (FEATURES,), "float32", row_group_size=500) as writer:
            writer.write(features, labels)
        paths.append(folder / name)
    return paths[0], paths[1]


def train_small(folder: Path) -> tuple[Path, Path]:
    """A small two-class job trained for one epoch by one worker: (its run directory, its test set)."""
    import shoal

    train, test = write_task(folder, rows=2000, test_rows=200)
    job = {"model": {"layers": [{"dense": 16, "activation": "relu"}, {"dense": 2}]},
           "data": {"train": str(train), "test": str(test)}, "train": {"epochs": 1, "batch_size": 64},
           "output": {"progress": "none"}, "checkpoint": {"every": 0}}
    return shoal.fit(job, workers=1, run_dir=folder / "run").run_dir, test


MODEL = 'layers = [{ dense = 32, activation = "relu" }, { dropout = 0.1 }, { dense = 2 }]'


def write_job(path: Path, train: Path, test: Path | None, *, extra: str = "", algorithm: str = "averaging",
              model: str = MODEL, epochs: int = 2, options: str = "") -> Path:
    """`options`: lines of the [algorithm] table besides its name."""
    test_line = f'test = "{test}"' if test else ""
    path.write_text(f"""
[model]
{model}
[data]
train = "{train}"
{test_line}
[algorithm]
name = "{algorithm}"
{options}
[train]
epochs = {epochs}
batch_size = 64
optimizer = {{ name = "adam", lr = 0.003 }}
[output]
progress = "lines"
{extra}
""")
    return path
