"""A folder of PNGs, imported with `shoal data import --format images`, trains a small CNN through `shoal train`.

60 generated 16x16 grey PNGs in 3 classes of 20, each class its own pattern (bright rows, bright
columns, a bright diagonal) under noise, so a conv2d layer learns it in a few epochs. One worker
trains for three epochs and is tested on the same images: its accuracy must be well above a third.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from shoal.events import read_events

TIMEOUT = 120  # each command; the import and the job together take about 20 seconds on two shared cores

JOB = """
[model]
layers = [{{ conv2d = 4, kernel = 3, activation = "relu" }}, {{ maxpool = 2 }}, {{ dense = 3 }}]
[data]
train = "{dataset}"
test = "{dataset}"
[algorithm]
name = "sync"
[train]
epochs = 3
batch_size = 10
optimizer = {{ name = "adam", lr = 0.01 }}
[output]
progress = "none"
[checkpoint]
every = 0
"""


def pattern(label: int, generator: np.random.Generator) -> np.ndarray:
    """A 16x16 grey image of class `label`: every other row bright (0), every other column (1), the diagonals (2)."""
    image = generator.integers(0, 60, size=(16, 16))
    rows, columns = np.indices((16, 16))
    bright = [rows % 2 == 0, columns % 2 == 0, (rows + columns) % 4 == 0][label]
    image[bright] += 180
    return image.astype(np.uint8)


def write_images(folder, generator: np.random.Generator) -> None:
    for label, name in enumerate(("rows", "columns", "diagonals")):
        (folder / name).mkdir(parents=True)
        for number in range(20):
            Image.fromarray(pattern(label, generator)).save(folder / name / f"{number:02d}.png")


def shoal(*arguments, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, arguments)], capture_output=True, text=True,
                          env=env, timeout=TIMEOUT)


@pytest.mark.timeout(240)
def test_a_folder_of_pngs_imports_and_trains(tmp_path, project_env):
    write_images(tmp_path / "images", np.random.default_rng(0))
    dataset = tmp_path / "dataset"
    imported = shoal("data", "import", tmp_path / "images", dataset, "--format", "images", env=project_env)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout == f"{dataset}: 60 rows, sample shape [1, 16, 16], classes ['columns', 'diagonals', " \
                              "'rows']\n"
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(dataset=dataset))
    trained = shoal("train", job, "--workers", 1, "--run-dir", tmp_path / "run", env=project_env)
    assert trained.returncode == 0, trained.stderr
    end = [event for event in read_events(tmp_path / "run") if event["event"] == "epoch_end"][-1]
    assert end["epoch"] == 3 and end["samples"] == 60
    assert end["test"]["accuracy"] > 0.6, end  # chance is a third
