"""Collectives on flat buffers, with the time they take counted apart from compute.

Parameters and gradients travel as one buffer per collective, not one message per tensor:
with many small layers that is the difference between one latency and hundreds. A world of
one skips communication entirely, so one worker is plain training at no cost.

Point-to-point messages (the parameter servers') go over the group `message_group()` names:
the default group under gloo, a gloo group of all ranks beside it under NCCL, which cannot
receive from any source.

Values other than tensors (hosts, a run directory, a checkpoint's state) travel as plain data
(`shoal.cluster.codec`), as bytes in a uint8 tensor, never pickled: torch's own object
collectives unpickle what a peer sends, which would let anyone who reaches the process group
run code in every rank. Nothing a peer sends can run code in this process.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from shoal.cluster.codec import CodecError, decode, encode
from shoal.cluster.pair_sum import exchanged, pair_sum_
from shoal.cluster.signed_messages import message_seal
from shoal.cluster.waits import WAITS
from shoal.errors import ShoalError


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


def byte_tensor(payload: bytes) -> torch.Tensor:
    """`payload` as a uint8 tensor in CPU memory (a copy)."""
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)


_messages: tuple[dist.ProcessGroup, dist.ProcessGroup | None] | None = None
"""(the default group, the group its messages go over), set by `open_message_group`."""


def open_message_group(timeout: timedelta | None = None) -> dist.ProcessGroup | None:
    """Choose, once per default group, the group that carries point-to-point messages.

    A parameter server takes whichever update comes first (receive from any source): gloo does
    that and NCCL does not, so under any backend but gloo the messages go over a gloo group of all
    ranks, in CPU memory. Collective: every rank calls it right after joining the default group.
    Returns the group (None: the default group itself).
    """
    global _messages
    if not dist.is_initialized():  # nothing joined: no messages to carry
        return None
    default = dist.group.WORLD
    if _messages is None or _messages[0] is not default:
        separate = dist.get_backend() != dist.Backend.GLOO
        _messages = (default, dist.new_group(backend=dist.Backend.GLOO, timeout=timeout) if separate else None)
    return _messages[1]


def message_group() -> dist.ProcessGroup | None:
    """The group point-to-point messages go over (None: the default group); see `open_message_group`."""
    if not dist.is_initialized():
        return None
    if _messages is not None and _messages[0] is dist.group.WORLD:
        return _messages[1]
    if dist.get_backend() == dist.Backend.GLOO:
        return None
    raise ShoalError(f"point-to-point messages under {dist.get_backend()} need a gloo group: call "
                     "shoal.cluster.collectives.open_message_group() on every rank after joining the process group")


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
    """A process group (or sub-group) with timed collectives; each collective and message is also marked as the
    calling thread's wait for the others (shoal.cluster.waits), which the stall inspector reads."""

    def __init__(self, rank: int, world_size: int, group: dist.ProcessGroup | None = None,
                 device: torch.device = torch.device("cpu")):
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.device = device  # where small tensors travel: NCCL moves only device memory
        self.seconds = 0.0  # time spent in collectives, read by the loop for its time split
        self.parent: Communicator | None = None  # the communicator this one was split from: it counts our time too
        self.seal = message_seal()  # None where the launcher handed no secret (torchrun, srun, mpirun)
        self.messages = 0  # the object messages this communicator sent: each one's number is in its MAC

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
        child = Communicator(mine.index(self.rank), len(mine), group=created, device=self.device)
        child.parent = self  # a group round's time is communication in the loop's split, not compute
        return child

    def global_rank(self, rank: int) -> int:
        """The world rank of this communicator's rank `rank` (for point-to-point messages)."""
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def detached(self) -> Communicator:
        """The same ranks with a clock of their own: for exchanges run beside the training loop (overlap), whose
        time is not the loop's communication; the loop counts only what it waits for (`count`)."""
        return Communicator(self.rank, self.world_size, group=self.group, device=self.device)

    def count(self, seconds: float) -> None:
        """Add `seconds` of communication to this communicator's clock and its parents'."""
        communicator = self
        while communicator is not None:
            communicator.seconds += seconds
            communicator = communicator.parent

    def _timed(self, operation, *args, **kwargs):
        start = time.perf_counter()
        thread = WAITS.enter()  # the stall inspector tells a rank that waits from one that is stuck elsewhere
        try:
            result = operation(*args, group=self.group, **kwargs)
        finally:
            WAITS.leave(thread)
        self.count(time.perf_counter() - start)
        return result

    def all_reduce_sum_(self, buffer: torch.Tensor) -> torch.Tensor:
        if exchanged(buffer, self.world_size):  # two ranks, a small tensor: one round, not gloo's two
            self._timed(pair_sum_, buffer, self.global_rank(1 - self.rank))
        elif self.world_size > 1:
            self._timed(dist.all_reduce, buffer, op=dist.ReduceOp.SUM)
        return buffer

    def all_reduce_mean_(self, buffer: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            self.all_reduce_sum_(buffer)
            buffer.div_(self.world_size)
        return buffer

    def broadcast_(self, buffer: torch.Tensor, source: int = 0) -> torch.Tensor:
        if self.world_size > 1:
            self._timed(dist.broadcast, buffer, src=self.global_rank(source))
        return buffer

    def reduce_sum_(self, buffer: torch.Tensor, destination: int = 0) -> torch.Tensor:
        """The sum over ranks into `buffer` on rank `destination` (other ranks' buffers are left undefined)."""
        if self.world_size > 1:
            self._timed(dist.reduce, buffer, dst=self.global_rank(destination), op=dist.ReduceOp.SUM)
        return buffer

    def all_to_all_(self, output: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
        """Equal chunks: chunk j of this rank's `tensor` goes to rank j; `output` gets the chunks in rank order."""
        if self.world_size == 1:
            return output.copy_(tensor)
        self._timed(dist.all_to_all_single, output, tensor)
        return output

    def all_gather_into_(self, output: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's `tensor`, concatenated in rank order into `output` (world_size times its numbers)."""
        if self.world_size == 1:
            return output.copy_(tensor.reshape(-1))
        self._timed(dist.all_gather_into_tensor, output, tensor)
        return output

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack of every rank's tensor, shape (world_size, *tensor.shape), on the tensor's device."""
        if self.world_size == 1:
            return tensor.unsqueeze(0)
        local = tensor.to(self.device)
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        self._timed(dist.all_gather, parts, local)
        return torch.stack(parts).to(tensor.device)

    def all_gather_object(self, value) -> list:
        """Every rank's `value`, in rank order, as plain data (`shoal.cluster.codec`: what cannot travel is a
        TypeError here, on the rank that sends it; every rank, this one too, gets decoded copies), each message
        signed with the job's secret where the launcher handed one (`shoal.cluster.signed_messages`)."""
        number = self._next_message()
        payloads = self.all_gather_bytes(self._signed(number, encode(value)))
        return [decode(self._opened(number, rank, payload), f"rank {rank}") for rank, payload in enumerate(payloads)]

    def broadcast_object(self, value, source: int = 0):
        """Rank `source`'s `value` on every rank (a copy on `source` too), as plain data (see `all_gather_object`);
        the others' `value` is ignored."""
        number = self._next_message()
        signed = self._signed(number, encode(value)) if self.rank == source else None
        return decode(self._opened(number, source, self.broadcast_bytes(signed, source)), f"rank {source}")

    def _next_message(self) -> int:
        self.messages += 1
        return self.messages

    def _where(self) -> str:
        """Which ranks this communicator joins, in the job's numbering: part of what each message's MAC covers."""
        return "all" if self.group is None else ",".join(map(str, dist.get_process_group_ranks(self.group)))

    def _signed(self, number: int, payload: bytes) -> bytes:
        return payload if self.seal is None else self.seal.sign(self._where(), number, self.rank, payload)

    def _opened(self, number: int, sender: int, signed: bytes) -> bytes:
        return signed if self.seal is None else self.seal.open(self._where(), number, sender, signed)

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        """Every rank's `payload`, in rank order: the sizes first, then the bytes padded to the longest."""
        if self.world_size == 1:
            return [bytes(payload)]
        sizes = self.all_gather(torch.tensor([len(payload)], dtype=torch.int64))[:, 0].tolist()
        if min(sizes) < 0:
            raise CodecError(f"refused a message of {min(sizes)} bytes from rank {sizes.index(min(sizes))}")
        padded = torch.zeros(max(sizes), dtype=torch.uint8, device=self.device)
        padded[: len(payload)] = byte_tensor(payload).to(self.device)
        parts = self.all_gather(padded).cpu()
        return [parts[rank, :size].numpy().tobytes() for rank, size in enumerate(sizes)]

    def broadcast_bytes(self, payload: bytes | None, source: int = 0) -> bytes:
        """Rank `source`'s `payload` on every rank (the others pass None): its size first, then its bytes."""
        if self.world_size == 1:
            return bytes(payload)
        size = torch.tensor([len(payload) if self.rank == source else 0], dtype=torch.int64, device=self.device)
        self.broadcast_(size, source)
        if self.rank == source:
            self.broadcast_(byte_tensor(payload).to(self.device), source)
            return bytes(payload)
        if int(size) < 0:
            raise CodecError(f"refused a message of {int(size)} bytes from rank {source}")
        received = self.broadcast_(torch.empty(int(size), dtype=torch.uint8, device=self.device), source)
        return received.cpu().numpy().tobytes()

    def send(self, tensor: torch.Tensor, destination: int, tag: int) -> None:
        """Point-to-point: `tensor` (in CPU memory) to world rank `destination`, as a message of kind `tag`."""
        start = time.perf_counter()
        thread = WAITS.enter()
        try:
            dist.send(tensor, dst=destination, tag=tag, group=message_group())
        finally:
            WAITS.leave(thread)
        self.seconds += time.perf_counter() - start

    def receive(self, tensor: torch.Tensor, source: int | None, tag: int) -> int:
        """Point-to-point: a message of kind `tag` into `tensor` (in CPU memory), from world rank `source` or
        any; the sender."""
        start = time.perf_counter()
        thread = WAITS.enter()
        try:
            sender = dist.recv(tensor, src=source, tag=tag, group=message_group())
        finally:
            WAITS.leave(thread)
        self.seconds += time.perf_counter() - start
        return sender

    def barrier(self) -> None:
        if self.world_size > 1:
            self._timed(dist.barrier)
