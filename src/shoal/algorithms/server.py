"""Parameter-server algorithms: rank 0 holds the central model and serves, the others train.

Trainers exchange with their server every `every` steps (and once more at the end of an epoch
if steps remain): one UPDATE message out, one REPLY back. Every rank knows each trainer's steps
in the epoch (`plan`: equal, or a faster trainer's more with shares sized by speed), so the server
knows in advance how many updates end it: it serves until that many have arrived (its rows are
used), then all ranks meet at the epoch's end (statistics, evaluation, checkpoint) as in the
other algorithms. Asynchronous servers answer whichever trainer sends first; synchronous ones
gather one update from every client before applying them together.

With groups (Downpour), ranks 1..G are sub-masters: each gathers one update from every trainer
of its group, combines them and acts as one worker toward the top server, then passes the
reply down. The staleness of every update the top server applies (its version minus the
version the sender started from) is summarized per epoch.

A resume on another number of workers reads rank 0's file only, the server's: the new server takes
its model, optimizer and version; every trainer and sub-master takes the server's model and its
version (so the staleness of its first update counts from there) and starts its own optimizer
afresh (in Downpour a trainer's optimizer takes no step; an asynchronous EASGD trainer's moments
were its own replica's).
"""

from __future__ import annotations

import abc
import math
import statistics
from collections.abc import Callable

from shoal.algorithms.base import Algorithm
from shoal.algorithms.groups import contiguous_groups
from shoal.algorithms.roles import Role
from shoal.cluster import messages
from shoal.cluster.messages import Message
from shoal.errors import ConfigError


class ServerAlgorithm(Algorithm, abc.ABC):
    """The roles, the message loop and the bookkeeping; subclasses say what an update means."""

    synchronous = False
    every = 1  # steps between a trainer's exchanges
    counts_nominal_steps = False  # a trainer exchanges every `every` of its own steps

    def __init__(self, options=None, groups: int | list[list[int]] = 1):
        if isinstance(groups, list):
            raise ConfigError('cluster.groups: "machine" groups are for averaging and synchronous EASGD; a parameter '
                              "server's sub-masters are ranks 1..G: give a number of groups")
        super().__init__(options, groups)
        self.steps_of: dict[int, int] = {}  # each trainer's steps this epoch, by rank
        self.version = 0  # updates applied by the top server; a trainer: the version its weights are from
        self.epoch_began = 0  # the version as the epoch being served began
        self.since = 0  # a trainer's steps since its last exchange
        self.rounds_per_epoch = 0
        self.staleness: list[int] = []
        self.on_update: Callable[[int], None] | None = None

    # ------------------------------------------------------------------ layout

    def relays(self) -> int:
        """Sub-masters between the top server and the trainers."""
        return self.groups if self.groups > 1 else 0

    def trainer_ranks(self, world_size: int) -> list[int]:
        return list(range(1 + self.relays(), world_size))

    def check(self, world_size: int) -> None:
        super().check(world_size)
        trainers = world_size - 1 - self.relays()
        if trainers < max(1, self.groups):
            need = 1 + self.relays() + max(1, self.groups)
            what = f"a server, {self.relays()} sub-masters and " if self.relays() else "a server and "
            raise ConfigError(f"cluster.workers: this algorithm needs {what}at least {max(1, self.groups)} "
                              f"trainer(s): {need} processes or more, got {world_size}")

    def group_members(self, world_size: int) -> list[list[int]]:
        """The trainers of each group, contiguous and of sizes differing by at most one."""
        trainers = self.trainer_ranks(world_size)
        return [[trainers[i] for i in group] for group in contiguous_groups(len(trainers), max(1, self.groups))]

    def role(self, rank: int, world_size: int) -> Role:
        """What `rank` does: rank 0 serves, the next `relays()` ranks relay, the rest train."""
        if rank == 0:
            return Role.SERVER
        return Role.RELAY if rank <= self.relays() else Role.TRAINER

    def links(self, rank: int, world_size: int) -> tuple[int | None, list[int]]:
        """(the rank `rank` sends its updates to, the ranks it serves)."""
        groups = self.group_members(world_size)
        if rank == 0:
            return None, (list(range(1, 1 + self.relays())) if self.relays() else groups[0])
        if rank <= self.relays():
            return 0, groups[rank - 1]
        group = next(i for i, members in enumerate(groups) if rank in members)
        return (1 + group if self.relays() else 0), []

    # ------------------------------------------------------------------ set-up

    def setup(self, model, optimizer, comm, on_update: Callable[[int], None] | None = None) -> None:
        """As Algorithm.setup; `on_update(version)` is called on the server after every update it applies."""
        super().setup(model, optimizer, comm, on_update)
        self.on_update = on_update
        self.parameters = [p for p in model.parameters()]
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.kind = self.role(comm.rank, comm.world_size)
        self.upstream, self.clients = self.links(comm.rank, comm.world_size)
        dtype = self.parameters[0].dtype  # messages in CPU memory whatever the model's device: gloo carries them
        self.update = Message(sum(p.numel() for p in self.parameters + self.buffers), dtype)
        self.reply = Message(sum(p.numel() for p in self.parameters), dtype)

    def same_steps(self) -> bool:
        """A synchronous server and sub-masters gather one update from every client each round."""
        return self.synchronous or self.relays() > 0

    def shares_changed(self, steps_by_trainer: dict[int, int]) -> None:
        self.plan(steps_by_trainer)

    def plan(self, steps: int | dict[int, int]) -> None:
        """Told before each epoch how many steps every trainer runs (one count, or each trainer's by rank):
        a trainer given more rows sends more updates, and the server serves until every one has come."""
        world_size = self.comm.world_size if self.comm is not None else None
        if isinstance(steps, int):
            steps = dict.fromkeys(self.trainer_ranks(world_size) if world_size else [], steps) or {-1: steps}
        self.steps_of = dict(steps)
        mine = steps.get(self.comm.rank) if self.comm is not None else None
        if mine is not None:
            self.every = self.every_for(mine)
        self.rounds_per_epoch = self.exchanges(max(steps.values()))  # alike for all where rounds gather

    def every_for(self, steps: int) -> int:
        """Steps between a trainer's exchanges when it runs `steps` steps an epoch."""
        return self.every

    def exchanges(self, steps: int) -> int:
        """Updates a trainer running `steps` steps sends in an epoch."""
        return math.ceil(steps / self.every_for(steps))

    # ------------------------------------------------------------------ trainer side

    def after_step(self, step: int) -> None:
        self.since += 1
        if self.since == self.every:
            self.exchange_()

    def end_epoch(self, epoch: int) -> None:
        if self.kind is Role.TRAINER and self.since:
            self.exchange_()

    def exchange_(self) -> None:
        """Send this trainer's update upstream and take in the reply."""
        self.fill_update(self.update)
        self.update.version = self.version
        self.comm.send(self.update.buffer, self.upstream, messages.UPDATE)
        self.comm.receive(self.reply.buffer, self.upstream, messages.REPLY)
        self.take_reply(self.reply)
        self.version = self.reply.version
        self.since = 0

    # ------------------------------------------------------------------ server side

    def serve_epoch(self, epoch: int) -> None:
        """Serve the trainers through epoch `epoch` (on the server and relays)."""
        self.epoch_began = self.version
        if self.kind is Role.RELAY:
            for _ in range(self.rounds_per_epoch):
                self.relay_round()
            return
        if self.synchronous:
            for _ in range(self.rounds_per_epoch):
                arrived = [self.receive_update() for _ in self.clients]
                arrived.sort(key=lambda item: item[0])  # the same sum whatever the arrival order
                self.apply_round([message for _, message in arrived])
                for source, message in arrived:
                    self.answer(source, message.version)
        else:
            for _ in range(self.updates_per_epoch()):
                source, message = self.receive_update(copy=False)
                self.apply_round([message])
                self.answer(source, message.version)

    def updates_per_epoch(self) -> int:
        """The updates the top server applies in an epoch (a synchronous round's are one)."""
        if self.synchronous:
            return self.rounds_per_epoch
        if self.relays():
            return self.rounds_per_epoch * len(self.clients)
        return sum(self.exchanges(self.steps_of.get(client, max(self.steps_of.values()))) for client in self.clients)

    def updates_this_epoch(self) -> int:
        """The updates the top server has applied since the epoch it serves began."""
        return self.version - self.epoch_began

    def receive_update(self, copy: bool = True) -> tuple[int, Message]:
        source = self.comm.receive(self.update.buffer, None, messages.UPDATE)
        return source, (self.update.copy() if copy else self.update)

    def apply_round(self, updates: list[Message]) -> None:
        """Apply one round's updates, count the version and the staleness of each."""
        for message in updates:
            self.staleness.append(self.version - message.version)
        self.apply(updates)
        self.version += 1
        if self.on_update is not None:
            self.on_update(self.version)

    def answer(self, destination: int, started_from: int) -> None:
        self.fill_reply(self.reply, started_from)
        self.reply.version = self.version
        self.comm.send(self.reply.buffer, destination, messages.REPLY)

    def relay_round(self) -> None:
        """A sub-master: one update from each trainer of the group, combined, sent up; the reply sent down."""
        arrived = sorted((self.receive_update() for _ in self.clients), key=lambda item: item[0])
        self.combine([message for _, message in arrived], self.update)
        self.update.version = self.version
        self.comm.send(self.update.buffer, self.upstream, messages.UPDATE)
        self.comm.receive(self.reply.buffer, self.upstream, messages.REPLY)
        self.version = self.reply.version
        for source, _ in arrived:
            self.comm.send(self.reply.buffer, source, messages.REPLY)

    def epoch_report(self) -> dict:
        if self.kind is not Role.SERVER:
            return {}
        values, self.staleness = self.staleness, []
        if not values:
            return {"updates": 0}
        return {"updates": len(values), "version": self.version,
                "staleness": {"mean": statistics.fmean(values), "median": statistics.median(values),
                              "max": max(values), "zero": sum(v == 0 for v in values) / len(values)}}

    # ------------------------------------------------------------------ what an update means

    @abc.abstractmethod
    def fill_update(self, message: Message) -> None:
        """A trainer: write its update (and `rows`) into the message."""

    @abc.abstractmethod
    def take_reply(self, message: Message) -> None:
        """A trainer: apply the server's reply to the local model."""

    def combine(self, updates: list[Message], into: Message) -> None:
        """A sub-master (and a synchronous server): the mean of the updates, weighted by their rows
        (equally when they carry none)."""
        rows = sum(m.rows for m in updates)
        into.payload.zero_()
        for message in updates:
            into.payload.add_(message.payload, alpha=(message.rows / rows) if rows else 1 / len(updates))
        into.rows = rows

    @abc.abstractmethod
    def apply(self, updates: list[Message]) -> None:
        """The server: apply updates (one, or a synchronous round's) to the central model."""

    @abc.abstractmethod
    def fill_reply(self, message: Message, started_from: int) -> None:
        """The server: what goes back to a trainer whose update started from version `started_from`."""

    def state_dict(self) -> dict:
        return {"version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.version = state["version"]

    def reshard_(self) -> None:
        """The server keeps the server's state; the others hold its model and version, and a fresh optimizer."""
        if self.kind is not Role.SERVER:
            self.optimizer.state.clear()
