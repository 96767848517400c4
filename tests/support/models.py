"""Model factories used by tests through `model.factory`."""

import os

from torch import nn


def failing_on_rank_one(features: int = 20):
    """A small model that raises on the worker of rank 1 (the launcher's check runs without RANK)."""
    if os.environ.get("RANK") == "1":
        raise RuntimeError("rank one refuses to build its model")
    return nn.Sequential(nn.Linear(features, 2))
