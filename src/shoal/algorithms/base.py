"""The Algorithm interface: hooks around an ordinary training loop.

The loop calls these hooks and nothing else about distribution, so a new algorithm is a new
hook object and the loop never changes. A server algorithm (a parameter server on rank 0)
says so through `trainer_ranks`, and the runner calls `serve_epoch` on the ranks that do not train.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from shoal.cluster.collectives import Communicator, FlatBuffer


@dataclass
class NoOptions:
    """An algorithm without options of its own."""


class Algorithm:
    """How workers combine their work. Subclasses override the hooks they need."""

    Options: type = NoOptions

    supports_groups = False  # whether cluster.groups > 1 means something to this algorithm

    def __init__(self, options=None, groups: int = 1):
        self.options = options if options is not None else self.Options()
        self.groups = groups  # cluster.groups
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.comm: Communicator | None = None

    @classmethod
    def build(cls, options, groups: int = 1) -> Algorithm:
        """The algorithm for these options (a class may hand over to a variant of itself)."""
        return cls(options, groups)

    def check(self, world_size: int) -> None:
        """Raise ConfigError for settings that do not fit `world_size` processes."""

    def trainer_ranks(self, world_size: int) -> list[int]:
        """The ranks that train (all of them unless a server takes some)."""
        return list(range(world_size))

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator) -> None:
        """Bind to the model, optimizer and communicator; start every rank from rank 0's weights."""
        self.model, self.optimizer, self.comm = model, optimizer, comm
        state = model_state(model)
        flat = FlatBuffer(state)
        comm.broadcast_(flat.pack(), source=0)
        flat.unpack_()

    def plan(self, steps_per_epoch: int) -> None:
        """Told before training how many steps every trainer runs per epoch."""

    def after_backward(self, rows: int) -> None:
        """Called after loss.backward() on a batch of `rows` rows."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Apply the update; by default the local optimizer's step."""
        optimizer.step()

    def after_step(self, step: int) -> None:
        """Called after the update of global step `step` (counted from 1 across epochs)."""

    def end_epoch(self, epoch: int) -> None:
        """Called when every worker has finished epoch `epoch` (from 0)."""

    def serve_epoch(self, epoch: int) -> None:
        """Serve the trainers through epoch `epoch` (only on ranks outside trainer_ranks)."""

    def consensus(self) -> contextlib.AbstractContextManager[nn.Module]:
        """The model to evaluate and save: by default this rank's replica as it stands."""
        return contextlib.nullcontext(self.model)

    def epoch_report(self) -> dict:
        """What this rank's algorithm has to say about the epoch just ended, for `epoch_end`."""
        return {}

    def state_dict(self) -> dict:
        """The algorithm's own state, for checkpoints."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned."""


def model_state(model: nn.Module) -> list[torch.Tensor]:
    """Parameters and floating-point buffers (batch-norm statistics): what replicas must share."""
    tensors = [p.data for p in model.parameters()]
    tensors += [b for b in model.buffers() if b.is_floating_point()]
    return tensors


class Plain(Algorithm):
    """No communication: one worker training alone."""
