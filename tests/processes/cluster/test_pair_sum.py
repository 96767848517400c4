"""Two real gloo processes: a small tensor's sum by shoal.cluster.pair_sum (one round each way) is the same bytes on
both ranks and the sum itself, in every dtype the exchanges send; a sub-group's ranks find their peer by world rank;
a tensor above the limit goes through gloo's all-reduce with the same result."""

from __future__ import annotations

import torch
import torch.distributed as dist

from shoal.cluster import pair_sum
from shoal.cluster.collectives import Communicator
from tests.distributed.harness import run_processes

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64)


def values(rank: int, dtype: torch.dtype, count: int = 1000) -> torch.Tensor:
    """Numbers whose sums round (fractions of many sizes), different on each rank."""
    generator = torch.Generator().manual_seed(7 + rank)
    numbers = torch.randn(count, generator=generator, dtype=torch.float64) * 10 ** torch.randint(-3, 4, (count,),
                                                                                                  generator=generator)
    return numbers.round().to(dtype) if not dtype.is_floating_point else numbers.to(dtype)


def sums(rank: int, world_size: int) -> dict:
    comm = Communicator(rank, world_size)
    found = {}
    for dtype in DTYPES:
        mine = values(rank, dtype)
        found[str(dtype)] = {"mine": mine.clone(), "sum": comm.all_reduce_sum_(mine.clone()),
                             "paired": pair_sum.exchanged(mine, world_size)}
    large = torch.ones(pair_sum.LARGEST_BYTES // 4 + 1) * (rank + 1)
    found["large"] = {"paired": pair_sum.exchanged(large, world_size), "sum": comm.all_reduce_sum_(large)}
    found["mean"] = comm.all_reduce_mean_(torch.tensor([1.0, 2.0]) * (rank + 1))
    found["counted"] = comm.seconds > 0  # the loop's time split still sees the exchange as communication
    dist.barrier()
    return found


def test_two_ranks_hold_the_same_exact_sum_and_a_large_tensor_takes_gloo_s_ring():
    first, second = run_processes(sums, 2, timeout=120)
    for dtype in DTYPES:
        one, two = first[str(dtype)], second[str(dtype)]
        assert one["paired"] and two["paired"]
        assert torch.equal(one["sum"], two["sum"])  # the same bytes on both ranks
        assert torch.equal(one["sum"], one["mine"] + two["mine"])  # and the sum, rounded once
    assert not first["large"]["paired"] and torch.equal(first["large"]["sum"], second["large"]["sum"])
    assert torch.all(first["large"]["sum"] == 3.0)
    assert torch.equal(first["mean"], torch.tensor([1.5, 3.0])) and torch.equal(second["mean"], first["mean"])
    assert first["counted"] and second["counted"]


def sub_group_sums(rank: int, world_size: int) -> dict:
    """Four ranks split in two pairs (0, 2) and (1, 3): each pair's sum, its peer found by world rank."""
    comm = Communicator(rank, world_size)
    pairs = comm.split([[0, 2], [1, 3]])
    total = pairs.all_reduce_sum_(torch.tensor([float(rank), 1.0]))
    dist.barrier()
    return {"total": total}


def test_a_pair_inside_a_larger_world_sums_with_its_own_peer():
    results = run_processes(sub_group_sums, 4, timeout=120)
    assert [result["total"].tolist() for result in results] == [[2.0, 2.0], [4.0, 2.0], [2.0, 2.0], [4.0, 2.0]]
