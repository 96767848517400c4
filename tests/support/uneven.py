"""A model factory for the tests of speed shares: one worker slower than the others, and one killed on cue.

Shares that follow speed move only when the workers' speeds differ; on one machine they do not, so
worker `slow` sleeps `delay` seconds in every training forward pass. Worker `victim` SIGKILLs itself
on its `at`-th training forward pass, once (`marker` is created first, so its restart trains on).
"""

import os
import signal
import time

import torch
from torch import nn

from shoal.cluster.env import get_dist_info


class Uneven(nn.Module):
    """A small MLP, slow on one worker and killed once on another."""

    def __init__(self, features: int, slow: int, delay: float, victim: int, at: int, marker: str):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(features, 16), nn.Tanh(), nn.Linear(16, 2))
        self.slow, self.delay, self.victim, self.at, self.marker = slow, delay, victim, at, marker
        self.count = 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        outputs = self.inner(inputs)
        if not self.training:
            return outputs
        self.count += 1
        rank = get_dist_info().rank
        if rank == self.slow and self.delay:
            time.sleep(self.delay)
        if rank == self.victim and self.count == self.at and self.marker and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return outputs


def uneven(features: int = 20, slow: int = 0, delay: float = 0.0, victim: int = -1, at: int = 0,
           marker: str = "") -> nn.Module:
    return Uneven(features, slow, delay, victim, at, marker)
