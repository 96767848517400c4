"""Elastic Averaging SGD, asynchronous: the centre variable lives on a parameter server.

Each trainer trains its own replica x_i with its own optimizer. Every `period` steps it sends
x_i to the server, which computes d = alpha * (x_i - x~) against its centre x~ as it stands,
moves the centre by d (with `momentum` m, by a velocity v <- m*v + d), and sends d back; the
trainer moves to x_i - d. Trainers meet the server whenever they are ready, not together, so
a slow one never holds up the others. The server's model is the centre: it is what the
coordinator evaluates, checkpoints and saves. (`synchronous = true` is the collective variant
in `elastic.py`; groups exist there only.)

Messages are in CPU memory (they travel over gloo); the server computes the difference and the
velocity on the model's device, and each message is copied to or from it once.
"""

from __future__ import annotations

import torch

from shoal.algorithms.elastic import ElasticOptions
from shoal.algorithms.roles import Role
from shoal.algorithms.server import ServerAlgorithm
from shoal.cluster.collectives import pack_into, unpack_from
from shoal.cluster.messages import Message
from shoal.errors import ConfigError


class AsynchronousElasticAveraging(ServerAlgorithm):
    """Elastic Averaging SGD, asynchronous: trainers send weights, a server answers with the elastic pull."""

    name = "easgd"
    variant = {"synchronous": False}
    Options = ElasticOptions
    supports_groups = False

    def __init__(self, options=None, groups: int = 1):
        super().__init__(options, groups)
        if self.options.compression != "none":
            raise ConfigError(f"algorithm.compression: {self.options.compression!r} applies to synchronous EASGD "
                              "only (synchronous = true); the asynchronous variant sends whole weights to its server")
        self.every = self.options.period if self.options.period != "epoch" else 1  # plan() sets it

    def check(self, world_size: int) -> None:
        if self.groups > 1:
            raise ConfigError("cluster.groups: asynchronous EASGD has no groups; set algorithm.synchronous = true "
                              "for hierarchical EASGD")
        super().check(world_size)

    def every_for(self, steps: int) -> int:
        return steps if self.options.period == "epoch" else self.options.period  # "epoch": once, at its end

    def setup(self, model, optimizer, comm, on_update=None) -> None:
        super().setup(model, optimizer, comm, on_update)
        device = self.parameters[0].device
        self.difference = torch.zeros(len(self.reply.payload), dtype=self.reply.dtype, device=device)
        self.velocity = torch.zeros_like(self.difference)

    def fill_update(self, message: Message) -> None:
        with torch.no_grad():
            pack_into(message.payload, self.parameters + self.buffers)
        message.rows = 0

    def take_reply(self, message: Message) -> None:
        with torch.no_grad():
            offset = 0
            for parameter in self.parameters:
                size = parameter.numel()
                parameter.sub_(message.payload[offset : offset + size].view_as(parameter).to(parameter.device))
                offset += size

    def apply(self, updates: list[Message]) -> None:
        """d = alpha * (x_i - centre) into the reply; the centre moves by d (or by its velocity)."""
        (message,) = updates
        difference = self.difference
        count = len(difference)
        with torch.no_grad():
            pack_into(difference, self.parameters)  # the centre, for now
            torch.sub(message.payload[:count].to(difference.device), difference, out=difference)
            difference.mul_(self.options.elastic_force)
            if self.options.momentum:
                self.velocity.mul_(self.options.momentum).add_(difference)
                step = self.velocity
            else:
                step = difference
            offset = 0
            for parameter in self.parameters:
                size = parameter.numel()
                parameter.add_(step[offset : offset + size].view_as(parameter))
                offset += size
            unpack_from(message.payload[count:], self.buffers)  # batch-norm statistics: the latest trainer's
            self.reply.payload.copy_(difference)

    def fill_reply(self, message: Message, started_from: int) -> None:
        """`apply` has already written the difference into the reply."""

    def state_dict(self) -> dict:
        return {"version": self.version, "velocity": self.velocity.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.version = state["version"]
        self.velocity.copy_(state["velocity"])

    def reshard_(self) -> None:
        """A trainer starts at the centre (the server's model); the centre's velocity stays the server's."""
        super().reshard_()
        if self.kind is not Role.SERVER:
            self.velocity.zero_()
