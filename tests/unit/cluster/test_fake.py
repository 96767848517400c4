"""The in-process fake communicator: the real one's interface and results, ranks as threads."""

from __future__ import annotations

import inspect
import threading
import time

import pytest
import torch

from shoal.cluster.collectives import Communicator
from shoal.cluster.fake import FakeCommunicator, FakeGroup, run_ranks

WORLD = 4


def values(rank: int) -> torch.Tensor:
    """A tensor that differs by rank, with fractions that make the summation order matter in float32."""
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(7, generator=generator) * 10 ** rank


def test_has_every_public_method_of_the_real_communicator_with_the_same_parameters():
    for name, method in inspect.getmembers(Communicator, inspect.isfunction):
        if name.startswith("_"):
            continue
        fake = getattr(FakeCommunicator, name, None)
        assert fake is not None, name
        assert list(inspect.signature(fake).parameters) == list(inspect.signature(method).parameters), name
    comm = FakeGroup(2).communicator(1)
    assert (comm.rank, comm.world_size, comm.seconds, comm.device) == (1, 2, 0.0, torch.device("cpu"))


def test_all_reduce_sum_and_mean_equal_the_sum_in_rank_order_on_every_rank():
    expected = values(0).clone()
    for rank in range(1, WORLD):
        expected += values(rank)

    def body(comm):
        summed = comm.all_reduce_sum_(values(comm.rank))
        mean = values(comm.rank)
        returned = comm.all_reduce_mean_(mean)
        return summed, mean, returned is mean

    results = run_ranks(WORLD, body)
    for summed, mean, in_place in results:
        assert torch.equal(summed, expected)  # bitwise: the same order on every rank
        assert torch.equal(mean, expected / WORLD)
        assert in_place


def test_broadcast_copies_the_source_rank_tensor_everywhere():
    def body(comm):
        buffer = values(comm.rank)
        comm.broadcast_(buffer, source=2)
        return buffer, comm.broadcast_object({"rank": comm.rank, "list": [comm.rank]}, source=1)

    for buffer, value in run_ranks(WORLD, body):
        assert torch.equal(buffer, values(2))
        assert value == {"rank": 1, "list": [1]}


def test_all_gather_stacks_every_rank_tensor_and_objects_in_rank_order():
    def body(comm):
        return comm.all_gather(values(comm.rank)), comm.all_gather_object(("host", comm.rank))

    expected = torch.stack([values(rank) for rank in range(WORLD)])
    for gathered, objects in run_ranks(WORLD, body):
        assert gathered.shape == (WORLD, 7)
        assert torch.equal(gathered, expected)
        assert objects == [("host", rank) for rank in range(WORLD)]


def test_gathered_objects_are_copies_not_shared_between_ranks():
    def body(comm):
        gathered = comm.all_gather_object([comm.rank])
        gathered[0].append("mine")
        comm.barrier()
        return gathered

    results = run_ranks(2, body)
    assert results == [[[0, "mine"], [1]], [[0, "mine"], [1]]]


def test_send_and_receive_from_a_named_and_from_any_source():
    tag = 11

    def body(comm):
        if comm.rank == 0:
            received, senders = {}, []
            for _ in range(comm.world_size - 1):  # from any: whoever came first
                buffer = torch.zeros(3)
                sender = comm.receive(buffer, None, tag)
                senders.append(sender)
                received[sender] = buffer
            for sender in sorted(senders):
                comm.send(received[sender] * 2, sender, tag + 1)
            return sorted(senders), received
        message = torch.full((3,), float(comm.rank))
        comm.send(message, 0, tag)
        message.fill_(-1.0)  # sent messages are copies: changing the tensor afterwards changes nothing
        reply = torch.zeros(3)
        assert comm.receive(reply, 0, tag + 1) == 0
        return reply

    results = run_ranks(WORLD, body)
    senders, received = results[0]
    assert senders == [1, 2, 3]
    for rank in range(1, WORLD):
        assert torch.equal(received[rank], torch.full((3,), float(rank)))
        assert torch.equal(results[rank], torch.full((3,), 2.0 * rank))


def test_receive_from_a_named_source_leaves_the_others_messages_waiting_in_order():
    def body(comm):
        if comm.rank == 0:
            time.sleep(0.05)  # both messages of rank 1 and the one of rank 2 are there
            order = []
            for source in (2, 1, 1):
                buffer = torch.zeros(1)
                assert comm.receive(buffer, source, 5) == source
                order.append((source, buffer.item()))
            return order
        for number in range(3 - comm.rank):  # rank 1 sends 10, 11; rank 2 sends 20
            comm.send(torch.tensor([10.0 * comm.rank + number]), 0, 5)
        return None

    assert run_ranks(3, body)[0] == [(2, 20.0), (1, 10.0), (1, 11.0)]


def test_split_makes_groups_that_reduce_apart_and_name_their_world_ranks():
    def body(comm):
        group = comm.split([[0, 1], [2, 3]])
        summed = group.all_reduce_sum_(torch.tensor([float(comm.rank + 1)]))
        # point to point names world ranks, also on a sub-communicator
        partner = group.global_rank(1 - group.rank)
        group.send(torch.tensor([float(comm.rank)]), partner, 3)
        heard = torch.zeros(1)
        sender = group.receive(heard, None, 3)
        return group.rank, group.world_size, summed.item(), sender, heard.item()

    results = run_ranks(WORLD, body)
    assert results == [(0, 2, 3.0, 1, 1.0), (1, 2, 3.0, 0, 0.0), (0, 2, 7.0, 3, 3.0), (1, 2, 7.0, 2, 2.0)]


def test_split_leaves_a_rank_in_no_group_alone_and_repeated_splits_are_separate_groups():
    def body(comm):
        outside = comm.split([[0, 1]])
        alone = (outside.rank, outside.world_size, outside.global_rank(outside.rank))
        first = comm.split([[0, 1, 2]])
        second = comm.split([[0, 1, 2]])
        return alone, first.group is not second.group, second.all_reduce_sum_(torch.ones(1)).item()

    results = run_ranks(3, body)
    assert [alone for alone, _, _ in results] == [(0, 2, 0), (1, 2, 1), (0, 1, 2)]
    assert all(separate for _, separate, _ in results)
    assert [total for _, _, total in results] == [3.0, 3.0, 3.0]


def test_seconds_counts_the_time_spent_waiting_for_the_others():
    def body(comm):
        if comm.rank == 1:
            time.sleep(0.2)
        comm.barrier()
        return comm.seconds

    waited = run_ranks(2, body)
    assert waited[0] >= 0.15
    assert waited[1] < waited[0]


def test_a_world_of_one_needs_no_other_rank():
    comm = FakeGroup(1).communicator(0)
    buffer = torch.arange(3.0)
    assert torch.equal(comm.all_reduce_mean_(buffer), torch.arange(3.0))
    assert torch.equal(comm.all_gather(buffer), torch.arange(3.0).unsqueeze(0))
    assert comm.broadcast_object("x") == "x"
    comm.barrier()


def test_a_missing_collective_times_out_naming_the_operation_and_the_rank():
    def body(comm):
        if comm.rank == 0:
            comm.all_reduce_sum_(torch.ones(2))  # rank 1 never joins

    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"fake all_reduce_sum_ on rank 0 of 2: not every rank joined within 0.3 s"):
        run_ranks(2, body, timeout=0.3)
    assert time.monotonic() - start < 3


def test_different_collectives_on_different_ranks_fail_on_every_rank():
    def body(comm):
        if comm.rank == 0:
            comm.all_reduce_sum_(torch.ones(2))
        else:
            comm.barrier()

    with pytest.raises(RuntimeError, match=r"called different collectives: rank 0: all_reduce_sum_, rank 1: barrier"):
        run_ranks(2, body, timeout=2)


def test_a_receive_without_a_sender_times_out_naming_the_source_and_tag():
    def body(comm):
        comm.receive(torch.zeros(1), 1, 12)

    with pytest.raises(TimeoutError, match=r"fake receive on world rank 0: no message of tag 12 from rank 1"):
        run_ranks(1, body, timeout=0.2)


def test_a_failing_rank_wakes_the_others_and_its_error_is_raised():
    def body(comm):
        if comm.rank == 1:
            raise ValueError("rank 1 broke")
        comm.barrier()  # would wait the whole timeout without the abort

    start = time.monotonic()
    with pytest.raises(ValueError, match="rank 1 broke") as caught:
        run_ranks(3, body, timeout=30)
    assert time.monotonic() - start < 5
    assert "(raised on fake rank 1 of 3)" in caught.value.__notes__


def test_a_rank_that_never_returns_is_reported_after_the_join_timeout():
    release = threading.Event()

    def body(comm):
        if comm.rank == 0:
            release.wait(5)

    try:
        with pytest.raises(TimeoutError, match=r"fake ranks \[0\] still running after 0.2 s"):
            run_ranks(2, body, join_timeout=0.2)
    finally:
        release.set()


def test_the_real_communicator_in_a_world_of_one_needs_no_process_group():
    assert not torch.distributed.is_initialized()
    comm = Communicator(0, 1)
    buffer = torch.arange(4.0)
    assert comm.all_reduce_sum_(buffer) is buffer and torch.equal(buffer, torch.arange(4.0))
    assert torch.equal(comm.all_reduce_mean_(buffer), torch.arange(4.0))
    assert torch.equal(comm.broadcast_(buffer), torch.arange(4.0))
    assert torch.equal(comm.all_gather(buffer), torch.arange(4.0).unsqueeze(0))
    assert comm.all_gather_object({"a": 1}) == [{"a": 1}]
    assert comm.broadcast_object("run") == "run"
    comm.barrier()
    assert comm.global_rank(0) == 0
    alone = comm.split([[0]])
    assert (alone.rank, alone.world_size) == (0, 1)
    assert comm.seconds == 0.0
