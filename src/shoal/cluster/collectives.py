"""Collectives on flat buffers, with the time they take counted apart from compute.

Parameters and gradients travel as one buffer per collective, not one message per tensor:
with many small layers that is the difference between one latency and hundreds. A world of
one skips communication entirely, so one worker is plain training at no cost.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist


def pack_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> int:
    """Copy `tensors` into consecutive slices of `flat`; returns the numbers used."""
    offset = 0
    for tensor in tensors:
        size = tensor.numel()
        flat[offset : offset + size].copy_(tensor.reshape(-1))
        offset += size
    return offset


def unpack_from(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> int:
    """Copy consecutive slices of `flat` into `tensors`; returns the numbers used."""
    offset = 0
    for tensor in tensors:
        size = tensor.numel()
        tensor.copy_(flat[offset : offset + size].view_as(tensor))
        offset += size
    return offset


class FlatBuffer:
    """One contiguous buffer mirroring a list of tensors, packed and unpacked in place."""

    def __init__(self, tensors: Sequence[torch.Tensor], extra: int = 0):
        self.tensors = list(tensors)
        total = sum(t.numel() for t in self.tensors) + extra
        first = self.tensors[0] if self.tensors else torch.empty(0)
        self.buffer = torch.zeros(total, dtype=first.dtype, device=first.device)

    def pack(self, tensors: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        pack_into(self.buffer, tensors if tensors is not None else self.tensors)
        return self.buffer

    def unpack_(self, tensors: Sequence[torch.Tensor] | None = None) -> None:
        unpack_from(self.buffer, tensors if tensors is not None else self.tensors)


class Communicator:
    """A process group (or sub-group) with timed collectives."""

    def __init__(self, rank: int, world_size: int, group: dist.ProcessGroup | None = None,
                 device: torch.device = torch.device("cpu")):
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.device = device  # where small tensors travel: NCCL moves only device memory
        self.seconds = 0.0  # time spent in collectives, read by the loop for its time split

    def split(self, members: list[list[int]]) -> Communicator:
        """A communicator over the list in `members` that holds this rank (ranks of this communicator).

        Every rank of this communicator must call it with the same `members`, in the same order;
        a rank in none of the lists gets a communicator of its own (world size 1).
        """
        mine = next((group for group in members if self.rank in group), [self.rank])
        if self.world_size == 1 or len(mine) == 1 and all(len(group) == 1 for group in members):
            return Communicator(0, 1, device=self.device)
        parent = dist.get_process_group_ranks(self.group) if self.group is not None else None
        created = None
        for group in members:  # new_group is collective: every rank creates every group
            ranks = [parent[r] for r in group] if parent is not None else list(group)
            handle = dist.new_group(ranks)
            if group is mine:
                created = handle
        if created is None:
            return Communicator(0, 1, device=self.device)
        return Communicator(mine.index(self.rank), len(mine), group=created, device=self.device)

    def global_rank(self, rank: int) -> int:
        """The world rank of this communicator's rank `rank` (for point-to-point messages)."""
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def _timed(self, operation, *args, **kwargs):
        start = time.perf_counter()
        result = operation(*args, group=self.group, **kwargs)
        self.seconds += time.perf_counter() - start
        return result

    def all_reduce_sum_(self, buffer: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            self._timed(dist.all_reduce, buffer, op=dist.ReduceOp.SUM)
        return buffer

    def all_reduce_mean_(self, buffer: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            self._timed(dist.all_reduce, buffer, op=dist.ReduceOp.SUM)
            buffer.div_(self.world_size)
        return buffer

    def broadcast_(self, buffer: torch.Tensor, source: int = 0) -> torch.Tensor:
        if self.world_size > 1:
            self._timed(dist.broadcast, buffer, src=source)
        return buffer

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack of every rank's tensor, shape (world_size, *tensor.shape), on the tensor's device."""
        if self.world_size == 1:
            return tensor.unsqueeze(0)
        local = tensor.to(self.device)
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        self._timed(dist.all_gather, parts, local)
        return torch.stack(parts).to(tensor.device)

    def all_gather_object(self, value):
        if self.world_size == 1:
            return [value]
        parts = [None] * self.world_size
        self._timed(dist.all_gather_object, parts, value)
        return parts

    def broadcast_object(self, value, source: int = 0):
        if self.world_size == 1:
            return value
        holder = [value]
        self._timed(dist.broadcast_object_list, holder, src=source)
        return holder[0]

    def send(self, tensor: torch.Tensor, destination: int, tag: int) -> None:
        """Point-to-point: `tensor` to world rank `destination`, as a message of kind `tag`."""
        start = time.perf_counter()
        dist.send(tensor, dst=destination, tag=tag)
        self.seconds += time.perf_counter() - start

    def receive(self, tensor: torch.Tensor, source: int | None, tag: int) -> int:
        """Point-to-point: a message of kind `tag` into `tensor`, from world rank `source` or any; the sender."""
        start = time.perf_counter()
        sender = dist.recv(tensor, src=source, tag=tag)
        self.seconds += time.perf_counter() - start
        return sender

    def barrier(self) -> None:
        if self.world_size > 1:
            self._timed(dist.barrier)
