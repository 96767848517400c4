"""An in-process stand-in for `Communicator`: N ranks as N threads of one process.

Unit tests drive the algorithms, the runner's steps and checkpoints with it, without processes,
ports or torch.distributed: `run_ranks(4, function)` calls `function(comm)` on four threads, one
per rank, and returns their results (or re-raises the first exception).

It keeps the real communicator's interface and meaning: collectives give every rank the same
result (sums are taken in rank order, so they are deterministic); point-to-point messages name
world ranks, are copied when sent and wait in per-(destination, tag) mailboxes, so a receive
from any source returns the sender's rank. Unlike gloo, a send never waits for its receiver.
`broadcast_` and `broadcast_object` take `source` as a rank of the communicator they are called on.
Objects travel through the real one's codec (`shoal.cluster.codec`), so a value that could not
cross the network (a dataclass, an arbitrary object) fails a unit test as it would fail a job.

Every wait has a timeout (a few seconds by default): a test whose ranks call different
collectives fails with an error naming the operation and the rank instead of hanging.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import torch

from shoal.cluster.codec import decode, encode

DEFAULT_TIMEOUT = 5.0  # seconds any rank waits for the others


class FakeGroup:
    """The ranks of one (sub-)communicator: a rendezvous for collectives, and the world's mailboxes."""

    def __init__(self, world_size: int, timeout: float = DEFAULT_TIMEOUT, members: Sequence[int] | None = None,
                 world: FakeGroup | None = None):
        self.world_size, self.timeout = world_size, timeout
        self.members = list(members) if members is not None else list(range(world_size))  # their world ranks
        self.world = world or self  # the group that holds the mailboxes and the sub-groups
        self._barrier = threading.Barrier(world_size, timeout=timeout)
        self._slots: list = [None] * world_size
        self._lock = threading.Condition()  # guards the mailboxes and the sub-groups (on the world group)
        self._mailboxes: dict[tuple[int, int], list[tuple[int, torch.Tensor]]] = {}
        self._groups: list[FakeGroup] = []
        self._children: dict[tuple, FakeGroup] = {}
        self._aborted = False

    def communicator(self, rank: int) -> FakeCommunicator:
        return FakeCommunicator(self, rank)

    def abort(self) -> None:
        """Wake every rank waiting anywhere in this world with an error (a rank has failed)."""
        world = self.world
        with world._lock:
            world._aborted = True
            groups = [world, *world._groups]
            world._lock.notify_all()
        for group in groups:
            group._barrier.abort()

    def exchange(self, operation: str, rank: int, value) -> list:
        """Every rank's `value`, in rank order, once all ranks have called the same operation."""
        self._slots[rank] = (operation, value)
        self._wait(operation, rank)
        entries = list(self._slots)
        self._wait(operation, rank)  # everyone has read the slots: they may be reused
        called = [name for name, _ in entries]
        if any(name != operation for name in called):
            raise RuntimeError(f"fake {operation} on rank {rank}: the ranks called different collectives: "
                               + ", ".join(f"rank {r}: {name}" for r, name in enumerate(called)))
        return [value for _, value in entries]

    def _wait(self, operation: str, rank: int) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            raise TimeoutError(f"fake {operation} on rank {rank} of {self.world_size}: not every rank joined "
                               f"within {self.timeout:g} s (a rank called another operation, returned early "
                               "or failed)") from None

    def subgroup(self, key: tuple, members: list[int]) -> FakeGroup:
        """The sub-group `key` (the same object for every rank that asks), made by the first to ask."""
        world = self.world
        with world._lock:
            if key not in self._children:
                group = FakeGroup(len(members), self.timeout, [self.members[r] for r in members], world)
                self._children[key] = group
                world._groups.append(group)
            return self._children[key]

    def post(self, source: int, destination: int, tag: int, tensor: torch.Tensor) -> None:
        world = self.world
        with world._lock:
            world._mailboxes.setdefault((destination, tag), []).append((source, tensor.detach().clone()))
            world._lock.notify_all()

    def take(self, destination: int, source: int | None, tag: int, operation: str) -> tuple[int, torch.Tensor]:
        """The oldest message of kind `tag` for `destination`, from `source` or any; waits for one."""
        world = self.world

        def find() -> int | None:
            box = world._mailboxes.get((destination, tag), [])
            return next((i for i, (sender, _) in enumerate(box) if source in (None, sender)), None)

        with world._lock:
            if not world._lock.wait_for(lambda: find() is not None or world._aborted, timeout=self.timeout) \
                    or world._aborted:
                raise TimeoutError(f"fake {operation} on world rank {destination}: no message of tag {tag} from "
                                   f"{'any rank' if source is None else f'rank {source}'} within {self.timeout:g} s"
                                   " (or another rank failed)")
            return world._mailboxes[(destination, tag)].pop(find())


class FakeCommunicator:
    """One rank's view of a FakeGroup, with the methods and attributes of `Communicator`."""

    def __init__(self, group: FakeGroup, rank: int, device: torch.device = torch.device("cpu")):
        self.group, self.rank, self.world_size = group, rank, group.world_size
        self.device = device
        self.seconds = 0.0  # time spent waiting in communication, as the real one counts it
        self.parent: FakeCommunicator | None = None  # as the real one: a sub-communicator's time counts here too
        self._splits = 0

    def _count(self, start: float) -> None:
        self.count(time.perf_counter() - start)

    def count(self, seconds: float) -> None:
        """Add `seconds` of communication to this communicator's clock and its parents'."""
        communicator = self
        while communicator is not None:
            communicator.seconds += seconds
            communicator = communicator.parent

    def detached(self) -> FakeCommunicator:
        """The same ranks with a clock of their own (as the real one)."""
        return FakeCommunicator(self.group, self.rank, self.device)

    def _exchange(self, operation: str, value) -> list:
        start = time.perf_counter()
        try:
            return self.group.exchange(operation, self.rank, value)
        finally:
            self._count(start)

    def split(self, members: list[list[int]]) -> FakeCommunicator:
        """The sub-communicator of the list in `members` holding this rank (collective, like the real one)."""
        self._splits += 1
        proposals = self._exchange("split", [list(group) for group in members])
        if any(proposal != proposals[0] for proposal in proposals):
            raise RuntimeError(f"fake split on rank {self.rank}: the ranks passed different members: {proposals}")
        mine = next((list(group) for group in members if self.rank in group), None)
        if mine is None:
            alone = FakeGroup(1, self.group.timeout, [self.global_rank(self.rank)], self.group.world)
            return FakeCommunicator(alone, 0, self.device)
        group = self.group.subgroup((self._splits, tuple(mine)), mine)
        child = FakeCommunicator(group, mine.index(self.rank), self.device)
        child.parent = self
        return child

    def global_rank(self, rank: int) -> int:
        """The world rank of this communicator's rank `rank`."""
        return self.group.members[rank]

    def all_reduce_sum_(self, buffer: torch.Tensor) -> torch.Tensor:
        parts = self._exchange("all_reduce_sum_", buffer.detach().clone())
        buffer.copy_(_sum(parts))
        return buffer

    def all_reduce_mean_(self, buffer: torch.Tensor) -> torch.Tensor:
        parts = self._exchange("all_reduce_mean_", buffer.detach().clone())
        buffer.copy_(_sum(parts))
        buffer.div_(self.world_size)  # as the real one: the sum, then divided in place
        return buffer

    def broadcast_(self, buffer: torch.Tensor, source: int = 0) -> torch.Tensor:
        parts = self._exchange(f"broadcast_(source={source})", buffer.detach().clone() if self.rank == source else None)
        buffer.copy_(parts[source])
        return buffer

    def reduce_sum_(self, buffer: torch.Tensor, destination: int = 0) -> torch.Tensor:
        parts = self._exchange(f"reduce_sum_(destination={destination})", buffer.detach().clone())
        if self.rank == destination:
            buffer.copy_(_sum(parts))
        return buffer

    def all_to_all_(self, output: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
        """Chunk j of this rank's `tensor` goes to rank j; `output` holds the chunks it receives in rank order."""
        parts = self._exchange("all_to_all_", tensor.detach().clone())
        output.copy_(torch.cat([part.chunk(self.world_size)[self.rank] for part in parts]))
        return output

    def all_gather_into_(self, output: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
        parts = self._exchange("all_gather_into_", tensor.detach().clone().reshape(-1))
        output.copy_(torch.cat(parts))
        return output

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack of every rank's tensor, shape (world_size, *tensor.shape), on the tensor's device."""
        parts = self._exchange("all_gather", tensor.detach().clone())
        return torch.stack(parts).to(tensor.device)

    def all_gather_object(self, value) -> list:
        """Every rank's `value` through the real one's codec: a value that could not travel fails here too."""
        payloads = self.all_gather_bytes(encode(value))
        return [decode(payload, f"rank {rank}") for rank, payload in enumerate(payloads)]

    def broadcast_object(self, value, source: int = 0):
        return decode(self.broadcast_bytes(encode(value) if self.rank == source else None, source), f"rank {source}")

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        return [bytes(part) for part in self._exchange("all_gather_bytes", bytes(payload))]

    def broadcast_bytes(self, payload: bytes | None, source: int = 0) -> bytes:
        return bytes(self._exchange(f"broadcast_bytes(source={source})", payload if self.rank == source else None)
                     [source])

    def send(self, tensor: torch.Tensor, destination: int, tag: int) -> None:
        """Point-to-point: a copy of `tensor` to world rank `destination`, as a message of kind `tag`."""
        self.group.post(self.global_rank(self.rank), destination, tag, tensor)

    def receive(self, tensor: torch.Tensor, source: int | None, tag: int) -> int:
        """A message of kind `tag` into `tensor`, from world rank `source` or any; returns the sender."""
        start = time.perf_counter()
        try:
            sender, message = self.group.take(self.global_rank(self.rank), source, tag, "receive")
        finally:
            self._count(start)
        if message.shape != tensor.shape:
            raise ValueError(f"fake receive on rank {self.rank}: a message of shape {tuple(message.shape)} from "
                             f"rank {sender} does not fit a tensor of shape {tuple(tensor.shape)}")
        tensor.copy_(message)
        return sender

    def barrier(self) -> None:
        self._exchange("barrier", None)


def _sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """The sum in rank order: the same numbers on every rank and in every run."""
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    return total


def run_ranks(world_size: int, function: Callable[[FakeCommunicator], object], *, timeout: float = DEFAULT_TIMEOUT,
              join_timeout: float = 60.0) -> list:
    """`function(comm)` on one thread per rank of a fresh FakeGroup; the results in rank order.

    The first exception raised on any rank is re-raised here (with a note naming the rank), after
    the other ranks have been woken from their waits; a rank still running after `join_timeout`
    seconds raises TimeoutError.
    """
    group = FakeGroup(world_size, timeout)
    results: list = [None] * world_size
    failures: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def body(rank: int) -> None:
        try:
            results[rank] = function(group.communicator(rank))
        except BaseException as error:  # handed to the calling thread, which re-raises it
            with lock:
                failures.append((rank, error))
            group.abort()

    threads = [threading.Thread(target=body, args=(rank,), name=f"fake-rank-{rank}", daemon=True)
               for rank in range(world_size)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + join_timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if failures:
        rank, error = failures[0]
        error.add_note(f"(raised on fake rank {rank} of {world_size})")
        raise error
    running = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
    if running:
        group.abort()
        raise TimeoutError(f"fake ranks {running} still running after {join_timeout:g} s")
    return results
