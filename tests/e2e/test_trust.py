"""A model object shipped by `shoal.fit` is named relative to the run directory, so the run can be moved."""

from __future__ import annotations

import numpy as np
from torch import nn

import shoal


def test_fit_names_the_shipped_model_relative_to_the_run_directory(tmp_path):
    features = np.random.default_rng(0).normal(size=(32, 3)).astype(np.float32)
    result = shoal.fit(model=nn.Linear(3, 2), train=(features, (features[:, 0] > 0).astype(np.int64)), workers=1,
                       epochs=1, run_dir=tmp_path / "run", output={"progress": "none"}, checkpoint={"every": 0})
    assert 'object = "model.object.pkl"' in (result.run_dir / "job.toml").read_text()
    assert isinstance(result.model, nn.Linear)
