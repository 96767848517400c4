"""The outer optimizer of averaging's rounds: DiLoCo (Douillard et al., 2023, "DiLoCo: Distributed Low-Communication
Training of Language Models", arXiv:2311.08105).

A plain round moves the consensus all the way to the replicas' mean. DiLoCo reads that move as a gradient instead:
the consensus before the round minus a worker's weights is what the worker learnt since (its pseudo-gradient), the
round averages those, and an outer optimizer (SGD with Nesterov momentum: lr 0.7, momentum 0.9 in the paper) takes
one step of the consensus with the averaged change as its gradient. With rounds hundreds of steps apart it trains
about as well as synchronous SGD, the paper finds, where a plain mean falls behind.

Every rank holds the same consensus, the same momentum and, after the round's exchange, the same averaged change,
so every rank computes the same bytes and the replicas stay equal. torch's SGD takes the step around the mean
rather than around the consensus: the tensor it moves starts as the averaged change g and ends as g - lr * update,
and the new consensus is the mean plus that. In exact arithmetic it is the consensus minus lr * update (the
consensus is the mean plus g); in floating point "sgd" with lr 1 and no momentum leaves exactly nothing (g - g),
so it is the plain mean to the bit. Only parameters step: batch-norm statistics take the plain mean, a statistic
that momentum should not carry on.
"""

from __future__ import annotations

import math

import torch

from shoal.errors import ConfigError

NAMES = ("sgd", "nesterov")
KEYS = ("name", "lr", "momentum")
EXAMPLE = '{ name = "nesterov", lr = 0.7, momentum = 0.9 }'


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_outer(outer) -> None:
    """`algorithm.outer` as a job file may give it: unset, or a table of name, lr and momentum."""
    if outer is None:
        return
    if not isinstance(outer, dict):
        raise ConfigError(f"algorithm.outer: must be a table such as {EXAMPLE}, got {outer!r}")
    for key in outer:
        if key not in KEYS:
            raise ConfigError(f"algorithm.outer.{key}: unknown key; the outer optimizer takes {', '.join(KEYS)}")
    for key in ("name", "lr"):
        if key not in outer:
            raise ConfigError(f"algorithm.outer.{key}: required, as in outer = {EXAMPLE}")
    name, lr, momentum = outer["name"], outer["lr"], outer.get("momentum", 0.0)
    if name not in NAMES:
        raise ConfigError(f"algorithm.outer.name: must be \"sgd\" or \"nesterov\", got {name!r}")
    if not _number(lr) or lr <= 0:
        raise ConfigError(f"algorithm.outer.lr: must be a number > 0, got {lr!r}")
    if not _number(momentum) or not 0 <= momentum < 1:
        raise ConfigError(f"algorithm.outer.momentum: must be a number from 0 up to (not including) 1, "
                          f"got {momentum!r}")
    if name == "nesterov" and momentum == 0:
        raise ConfigError("algorithm.outer.momentum: \"nesterov\" needs a momentum > 0 (DiLoCo's is 0.9), got 0")


class OuterOptimizer:
    """torch's SGD stepping the consensus's first `size` numbers (the parameters) with a round's averaged change."""

    def __init__(self, outer: dict, size: int, like: torch.Tensor):
        check_outer(outer)
        self.size = size
        self.moved = torch.zeros(size, dtype=like.dtype, device=like.device)  # the tensor SGD moves: g, then its step
        self.optimizer = torch.optim.SGD([self.moved], lr=float(outer["lr"]),
                                         momentum=float(outer.get("momentum", 0.0)),
                                         nesterov=outer["name"] == "nesterov")

    def step_(self, mean: torch.Tensor, change: torch.Tensor) -> None:
        """Make `mean` (the round's mean of the parameters) the new consensus, given `change`: the consensus before
        the round minus each replica, averaged (the same on every rank)."""
        self.moved.copy_(change)
        self.moved.grad = change
        self.optimizer.step()  # moved = g - lr * update
        self.moved.grad = None
        mean.add_(self.moved)

    def state_dict(self) -> dict:
        """The momentum buffer (none before the first step, or without momentum)."""
        buffer = self.optimizer.state.get(self.moved, {}).get("momentum_buffer")
        return {} if buffer is None else {"momentum": buffer.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.state.clear()
        if "momentum" not in state:
            return
        buffer = state["momentum"]
        if buffer.shape != self.moved.shape:  # a checkpoint of another model: never guess
            raise ConfigError(f"algorithm.outer: the saved momentum has {buffer.numel()} numbers, this model "
                              f"{self.size} parameters")
        self.optimizer.state[self.moved]["momentum_buffer"] = buffer.to(self.moved).clone()
