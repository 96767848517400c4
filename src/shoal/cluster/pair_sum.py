"""The sum of a small tensor between exactly two ranks in one round instead of gloo's two.

gloo's all-reduce of two ranks runs a ring: half the numbers go each way and are summed, then the
summed halves go back, two message latencies in a row. Two ranks can instead send each other the
whole tensor at once and each add what it received: the same bytes each way, one latency. Where a
message costs more than its bytes (on the project's VMs about 2 ms to wake a waiting process,
against 1 ms for 128 KB at 1 Gbit/s), that is the cheaper sum: a whole training step of three small
models took 0.92-1.01x as long as DDP's in the same processes over two runs, while a 10.6 MB model's
step took 1.46x (benchmarks/exchange_ab.py, benchmarks/results/2026-11-29-2core-cpu-exchange-ab*.md).
So tensors up to LARGEST_BYTES go this way, larger ones through gloo's ring.

Both ranks get the same bytes: each adds the other's tensor to its own, and IEEE addition is
commutative (a + b is b + a, bit for bit, in every floating-point and integer type).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

LARGEST_BYTES = 1 << 20
"""Tensors up to this size are summed by the exchange; larger ones by gloo's ring."""
TAG = 0x5A17
"""The exchange's messages' kind: nothing else sends point-to-point in the training's process group (object and
parameter-server messages have a group of their own)."""


def exchanged(buffer: torch.Tensor, world_size: int) -> bool:
    """Whether `buffer` is summed by the exchange: two ranks, CPU memory (NCCL's all-reduce stays), small enough.
    Every rank decides alike, from what every rank holds alike."""
    return world_size == 2 and buffer.device.type == "cpu" and buffer.numel() * buffer.element_size() <= LARGEST_BYTES


def pair_sum_(buffer: torch.Tensor, peer: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """`buffer` plus the other rank's (world rank `peer`), in place, on both ranks at once."""
    other = torch.empty_like(buffer)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, buffer, peer, group, TAG),
                                    dist.P2POp(dist.irecv, other, peer, group, TAG)])
    for work in works:
        work.wait()
    return buffer.add_(other)
