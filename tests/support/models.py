"""Model factories used by tests through `model.factory`: ordinary models that misbehave on cue, or compile."""

import os
import signal
import sys
import time

import torch
from torch import nn

from shoal.cluster.env import get_dist_info


def failing_on_rank_one(features: int = 20):
    """A small model that raises on the worker of rank 1 (the launcher's check runs without RANK)."""
    if os.environ.get("RANK") == "1":
        raise RuntimeError("rank one refuses to build its model")
    return nn.Sequential(nn.Linear(features, 2))


class Saboteur(nn.Module):
    """Wraps a small MLP; on its `at`-th training forward pass on `rank`, does `action` once.

    Actions: "kill" (SIGKILL itself), "stop" (SIGSTOP itself), "nan" (the output becomes NaN),
    "none". `marker` is a file created when the action fires, so a restarted worker goes on
    normally. `delay` slows every training step, to give a test time to act mid-epoch.
    """

    def __init__(self, features: int, rank: int, at: int, action: str, marker: str, delay: float):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(features, 16), nn.Tanh(), nn.Linear(16, 2))
        self.rank, self.at, self.action, self.marker, self.delay = rank, at, action, marker, delay
        self.count = 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        outputs = self.inner(inputs)
        if not self.training:
            return outputs
        self.count += 1
        if self.delay:
            time.sleep(self.delay)
        fire = (self.action != "none" and self.count == self.at and get_dist_info().rank == self.rank
                and not (self.marker and os.path.exists(self.marker)))
        if fire:
            if self.marker:
                open(self.marker, "w").close()
            if self.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.action == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif self.action == "nan":
                return outputs * float("nan")
        return outputs


def sabotaged(features: int = 20, rank: int = 1, at: int = 0, action: str = "none", marker: str = "",
              delay: float = 0.0) -> nn.Module:
    return Saboteur(features, rank, at, action, marker, delay)


class FailsAgainAtOnce(nn.Module):
    """A small MLP whose worker of `rank` is killed (SIGKILL) at its `at`-th training forward pass, then again at
    the first training forward pass of the worker that restarts: a restart that fails before its first step.
    Files in `folder` tell each kill that it happened, so the next worker goes on normally."""

    def __init__(self, features: int, rank: int, at: int, folder: str):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(features, 16), nn.Tanh(), nn.Linear(16, 2))
        self.rank, self.at, self.folder = rank, at, folder
        self.count = 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training and get_dist_info().rank == self.rank:
            self.count += 1
            first, again = os.path.join(self.folder, "killed"), os.path.join(self.folder, "killed-again")
            due = first if self.count == self.at and not os.path.exists(first) else None
            if os.path.exists(first) and not os.path.exists(again) and self.count == 1:
                due = again
            if due is not None:
                open(due, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        return self.inner(inputs)


def failing_again_at_once(features: int = 20, rank: int = 1, at: int = 0, folder: str = "") -> nn.Module:
    return FailsAgainAtOnce(features, rank, at, folder)


class WithAnInfiniteWeight(nn.Module):
    """A small MLP beside a parameter that is infinite and never trained (no loss reaches it): training goes on
    with a finite loss, and the weights to save are not all finite."""

    def __init__(self, features: int):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(features, 2))
        self.unused = nn.Parameter(torch.full((3,), float("inf")))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.inner(inputs)


def with_an_infinite_weight(features: int = 20) -> nn.Module:
    return WithAnInfiniteWeight(features)


class Compiled(nn.Module):
    """A small MLP whose activation runs through torch.compile, as a user's own model may: the worker's stand-in for
    the compiler gives way to the real one. `marker` is written with what then answers for the compiler."""

    def __init__(self, features: int, marker: str):
        super().__init__()
        self.first, self.second = nn.Linear(features, 16), nn.Linear(16, 2)
        self.activation = torch.compile(torch.tanh, backend="eager")
        self.marker = marker

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        outputs = self.second(self.activation(self.first(inputs)))
        if self.training and self.marker and not os.path.exists(self.marker):
            with open(self.marker, "w") as file:
                file.write(type(sys.modules["torch._dynamo"]).__name__)
        return outputs


def compiled(features: int = 20, marker: str = "") -> nn.Module:
    return Compiled(features, marker)
