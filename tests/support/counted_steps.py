"""A model whose trainers count their training steps in files, so that a test can tell who ran ahead of whom.

Whether a slow trainer holds the others up is a question of order, not of speed: a test that compares step
rates fails when the machine's load moves them. Here every training forward pass writes its worker's count
of them to `folder`/rank-N. The straggler (worker `rank`) reads the other trainers' counts at each of its
steps and keeps in `folder`/straggler.json the counts it found at its first step and the most steps any
other had done beyond its own. With `wait_for`, its first step first waits until every other trainer has
done that many steps (at most `hold` seconds, a guard against a hang only); `delay` sleeps in each of its
steps, time in which the others would run ahead if they could.
"""

import json
import os
import time
from pathlib import Path

import torch
from torch import nn


def write_whole(path: Path, text: str) -> None:
    """Readers see the old text or the new one, never half of it."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


class CountedSteps(nn.Module):
    """A small MLP that counts its training forward passes; the straggler also waits and reads the others'."""

    def __init__(self, features: int, rank: int, folder: str, trainers: list[int], wait_for: int, hold: float,
                 delay: float):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(features, 32), nn.Tanh(), nn.Linear(32, 2))
        self.own = int(os.environ.get("RANK", "-1"))  # -1: the launcher's checks, which train nothing
        self.straggler = self.own == rank
        self.folder, self.others = Path(folder), [trainer for trainer in trainers if trainer != rank]
        self.wait_for, self.hold, self.delay = wait_for, hold, delay
        self.steps = 0
        self.found: dict = {}

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled() and self.own >= 0:  # a training step, not a probe
            self.steps += 1
            write_whole(self.folder / f"rank-{self.own}", str(self.steps))
            if self.straggler:
                self.straggle()
        return self.inner(inputs)

    def counts(self) -> dict[int, int]:
        """Each other trainer's steps so far (0 before its first)."""
        paths = {rank: self.folder / f"rank-{rank}" for rank in self.others}
        return {rank: int(path.read_text()) if path.exists() else 0 for rank, path in paths.items()}

    def straggle(self) -> None:
        if self.steps == 1:
            deadline = time.monotonic() + self.hold
            while self.wait_for and min(self.counts().values()) < self.wait_for and time.monotonic() < deadline:
                time.sleep(0.02)
            self.found["first"] = self.counts()
        time.sleep(self.delay)
        ahead = max(self.counts().values()) - self.steps
        self.found["ahead"] = max(self.found.get("ahead", ahead), ahead)
        self.found["steps"] = self.steps
        write_whole(self.folder / "straggler.json", json.dumps(self.found))


def counted_steps(features: int = 20, rank: int = 1, folder: str = "", trainers: list[int] = (), wait_for: int = 0,
                  hold: float = 60.0, delay: float = 0.0) -> nn.Module:
    return CountedSteps(features, rank, folder, list(trainers), wait_for, hold, delay)
