"""Downpour SGD (Dean et al.; mpi_learn's default): an asynchronous parameter server.

Rank 0 holds the central model and the job's optimizer and does not train. Each trainer
computes gradients over `sync_every` batches without changing its weights, sends their
row-weighted mean, and continues from the weights the server sends back. Asynchronously the
server applies whichever update arrives first, so fast trainers run ahead of slow ones and
updates can be stale (computed on weights some versions old); `synchronous = true` makes the
server wait for one update from every trainer and apply their mean as one step, which is
synchronous SGD with the server's optimizer.

Messages are in CPU memory (they travel over gloo); the gradient sum stays on the model's
device, and each message is copied to or from it once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shoal.algorithms.server import ServerAlgorithm
from shoal.cluster.collectives import pack_into, unpack_from
from shoal.cluster.messages import Message
from shoal.errors import ConfigError


@dataclass
class DownpourOptions:
    sync_every: int = 1
    """Batches whose gradients a trainer accumulates before sending them."""
    synchronous: bool = False
    """Wait for every trainer each round (synchronous SGD through the server)."""

    def __post_init__(self) -> None:
        if isinstance(self.sync_every, bool) or not isinstance(self.sync_every, int) or self.sync_every < 1:
            raise ConfigError(f"algorithm.sync_every: must be an integer >= 1, got {self.sync_every!r}")
        if not isinstance(self.synchronous, bool):
            raise ConfigError(f"algorithm.synchronous: must be true or false, got {self.synchronous!r}")


class Downpour(ServerAlgorithm):
    """Downpour SGD: trainers send gradients to a parameter server, which steps and sends weights back."""

    name = "downpour"
    Options = DownpourOptions
    supports_groups = True

    def __init__(self, options=None, groups: int = 1):
        super().__init__(options, groups)
        self.every = self.options.sync_every
        self.synchronous = self.options.synchronous

    def setup(self, model, optimizer, comm, on_update=None) -> None:
        super().setup(model, optimizer, comm, on_update)
        self.gradient_sum = torch.zeros(sum(p.numel() for p in self.parameters), dtype=self.update.dtype,
                                        device=self.parameters[0].device)
        self.rows = 0

    def after_backward(self, rows: int) -> None:
        """Take the gradients over: the server steps with them, so the local optimizer finds none."""
        offset = 0
        for parameter in self.parameters:
            size = parameter.numel()
            if parameter.grad is not None:
                self.gradient_sum[offset : offset + size].add_(parameter.grad.reshape(-1), alpha=rows)
                parameter.grad = None
            offset += size
        self.rows += rows

    def fill_update(self, message: Message) -> None:
        count = len(self.gradient_sum)
        message.payload[:count].copy_(self.gradient_sum.div_(max(self.rows, 1)))
        pack_into(message.payload[count:], self.buffers)
        message.rows = self.rows
        self.gradient_sum.zero_()
        self.rows = 0

    def take_reply(self, message: Message) -> None:
        with torch.no_grad():
            unpack_from(message.payload, self.parameters)

    def apply(self, updates: list[Message]) -> None:
        if len(updates) == 1:
            payload = updates[0].payload
        else:
            combined = Message(len(self.update.payload), self.update.dtype)
            self.combine(updates, combined)
            payload = combined.payload
        offset = 0
        for parameter in self.parameters:
            size = parameter.numel()
            parameter.grad = payload[offset : offset + size].view_as(parameter).to(parameter.device, copy=True)
            offset += size
        self.optimizer.step()
        with torch.no_grad():
            unpack_from(payload[offset:], self.buffers)

    def fill_reply(self, message: Message, started_from: int) -> None:
        with torch.no_grad():
            pack_into(message.payload, self.parameters)
