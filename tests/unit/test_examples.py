"""The example jobs load, and what their comments say they do is what their settings do."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.jobs import load_job

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda path: path.name)
def test_every_example_job_loads(path):
    assert load_job(str(path), []).model is not None


def test_the_perceptron_example_says_mini_batch_and_batch_mode_is_one_setting_away():
    path = EXAMPLES / "digits-perceptron.toml"
    header = path.read_text().split("[model]")[0]
    job = load_job(str(path), [])
    assert job.algorithm.name == "sync" and job.train.accumulate is None  # a step per batch
    assert "mini-batch synchronous SGD" in header and "trained in batch mode" not in header
    batch_mode = load_job(str(path), ['train.accumulate="epoch"'])  # what the comment offers
    assert batch_mode.train.accumulate == "epoch"
