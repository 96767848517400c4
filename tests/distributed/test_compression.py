"""The compressors over real gloo collectives, three processes: the same bytes as the in-process fake.

Three ranks take half precision's general path (an all-to-all of chunks summed in fp32, then an
all-gather; two ranks use one all-reduce) and PowerSGD's two all-reduces; every rank must end
with the same bytes, and those the fake communicator computes from the same contributions.
"""

from __future__ import annotations

import torch

from shoal.algorithms.compression import make_compressor
from shoal.cluster.collectives import Communicator
from shoal.cluster.fake import run_ranks
from tests.distributed.harness import run_processes

SHAPES = [torch.Size([12, 9]), torch.Size([12]), torch.Size([5, 7])]  # a length the 3 ranks do not divide
NAMES = ("bf16", "fp16", "powersgd")


def contribution(rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(sum(shape.numel() for shape in SHAPES), generator=generator)


def summed(comm, steps: int = 3) -> dict[str, list[torch.Tensor]]:
    """Each compression's result for `steps` steps of this rank's contribution (PowerSGD's feedback carries on)."""
    found = {}
    for name in NAMES:
        compressor, results = make_compressor(name, rank=2, seed=7), []
        for _ in range(steps):
            flat = contribution(comm.rank)
            compressor.sum_(flat, SHAPES, "0", comm)
            results.append(flat)
        found[name] = results
    return found


def over_gloo(rank: int, world_size: int) -> dict:
    return summed(Communicator(rank, world_size))


def test_three_gloo_ranks_hold_the_same_bytes_as_the_fake():
    real = run_processes(over_gloo, 3)
    fake = run_ranks(3, summed, timeout=20)
    for name in NAMES:
        for step in range(3):
            for rank in range(3):
                assert torch.equal(real[rank][name][step], real[0][name][step]), (name, step, rank)
            if name == "powersgd":  # gloo's ring adds the P's and Q's in another order than the fake's rank order
                torch.testing.assert_close(real[0][name][step], fake[0][name][step], rtol=1e-4, atol=1e-5)
            else:  # each chunk summed in fp32 in rank order by its owner, on both
                assert torch.equal(real[0][name][step], fake[0][name][step]), (name, step)
