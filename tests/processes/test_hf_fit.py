"""`shoal.fit` trains on Hugging Face Datasets: number columns read from Parquet files the test makes (a
memory-mapped Dataset, split by `train_test_split`, so its rows are an index mapping over the table), and a
column of small uint8 images, each learned by a real worker above chance."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import shoal

datasets = pytest.importorskip("datasets", reason="shoal.fit(train=) of a Hugging Face Dataset needs `datasets`")
FEATURES, SIDE = 6, 8
SETTINGS = {"workers": 1, "epochs": 2, "batch_size": 32, "optimizer": {"name": "adam", "lr": 0.01},
            "algorithm": "sync", "output": {"progress": "none"}, "checkpoint": {"every": 0}}


def number_files(folder, rows: int, seed: int = 0) -> list[str]:
    """Parquet files of FEATURES number columns; the label ("yes" or "no") says whether x0 + x1 > 0."""
    generator = np.random.default_rng(seed)
    paths = []
    for part in range(2):
        values = generator.normal(size=(rows // 2, FEATURES))
        columns = {f"x{column}": values[:, column] for column in range(FEATURES)}
        columns["label"] = np.where(values[:, 0] + values[:, 1] > 0, "yes", "no")
        paths.append(str(folder / f"part-{part}.parquet"))
        pq.write_table(pa.table(columns), paths[-1])
    return paths


def images(rows: int, seed: int) -> datasets.Dataset:
    """SIDE x SIDE uint8 images of noise, the left half brighter in class 1 (ClassLabel labels)."""
    generator = np.random.default_rng(seed)
    labels = generator.integers(0, 2, rows)
    pixels = generator.integers(0, 128, (rows, SIDE, SIDE)).astype(np.uint8)
    pixels[labels == 1, :, : SIDE // 2] += 100
    features = datasets.Features({"image": datasets.Array2D((SIDE, SIDE), "uint8"),
                                  "label": datasets.ClassLabel(names=["plain", "bright"])})
    return datasets.Dataset.from_dict({"image": list(pixels), "label": labels}, features=features)


@pytest.mark.timeout(240)  # about 15 seconds on two shared cores
def test_number_columns_from_parquet_files_train_above_chance(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    table = datasets.Dataset.from_parquet(number_files(tmp_path, 1600), cache_dir=str(tmp_path / "cache"))
    split = table.train_test_split(test_size=0.25, seed=0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 2))
    result = shoal.fit(model=model, train=split["train"], test=split["test"], **SETTINGS)
    assert [epoch.epoch for epoch in result.epochs] == [1, 2]
    assert result.metrics["accuracy"] > 0.8  # chance is about 0.5


@pytest.mark.timeout(240)  # about 15 seconds on two shared cores
def test_a_column_of_images_trains_above_chance(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, 16), nn.ReLU(), nn.Linear(16, 2))
    result = shoal.fit(model=model, train=images(1200, 0), test=images(400, 1), **SETTINGS)
    assert result.metrics["accuracy"] > 0.8
