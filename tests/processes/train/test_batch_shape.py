"""Through real workers and the command line: a transform whose crop the model refuses ends the job in one line
naming `data.transform` and both shapes, exit status 2, no torch traceback; and a model given to shoal.fit whose
outputs do not fit the classes is named as fit's argument, `model`."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from torch import nn

import shoal
from shoal.data.format import DatasetWriter
from shoal.errors import ConfigError

ROWS, BATCH = 128, 32

CROP = '''
def crop(batch):
    """A 12x12 corner of each 28x28 image."""
    inputs, labels = batch
    return inputs[..., :12, :12], labels
'''

JOB = """
[model]
layers = [{{ conv2d = 1, kernel = 3 }}, {{ flatten = true }}, {{ dense = 2 }}]
[data]
train = "{train}"
transform = "crop:crop"
[algorithm]
name = "sync"
[train]
epochs = 1
batch_size = {batch}
[output]
progress = "none"
[cluster]
threads = 1
"""


def write_images(path) -> None:
    generator = np.random.default_rng(0)
    with DatasetWriter(str(path), (1, 28, 28), "float32") as writer:
        writer.write(generator.normal(size=(ROWS, 1, 28, 28)).astype(np.float32), generator.integers(0, 2, ROWS))


@pytest.mark.timeout(180)  # 10 to 30 seconds on two shared cores
def test_a_crop_the_model_refuses_stops_the_job_in_one_line_naming_the_transform(tmp_path, project_env):
    write_images(tmp_path / "images")
    (tmp_path / "crop.py").write_text(CROP)
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(train=tmp_path / "images", batch=BATCH))
    finished = subprocess.run([sys.executable, "-m", "shoal", "train", str(job), "--workers", "2", "--run-dir",
                               str(tmp_path / "run")], capture_output=True, text=True, env=project_env,
                              cwd=tmp_path, timeout=120)
    output = finished.stdout + finished.stderr
    assert finished.returncode == 2, output[-3000:]
    expected = (f"data.transform: returned inputs of shape [{BATCH}, 1, 12, 12]; the model takes "
                f"[{BATCH}, 1, 28, 28] (the batch's shape before the transform)")
    assert expected in finished.stderr, output[-3000:]
    assert "Traceback" not in output and "mat1 and mat2" not in output, output[-3000:]


@pytest.mark.timeout(120)  # refused before any worker starts: a few seconds
def test_a_model_given_to_fit_whose_outputs_miss_the_classes_is_named_as_fit_s_argument(tmp_path):
    generator = np.random.default_rng(0)
    features = generator.normal(size=(ROWS, 5)).astype(np.float32)
    labels = generator.integers(0, 2, ROWS)
    with pytest.raises(ConfigError) as raised:
        shoal.fit(model=nn.Linear(5, 7), train=(features, labels), workers=1, run_dir=tmp_path / "run",
                  epochs=1, output={"progress": "none"})
    assert str(raised.value).startswith("model: the model gives outputs of shape [7], but data.train has 2 classes")
    assert not (tmp_path / "run").exists()
