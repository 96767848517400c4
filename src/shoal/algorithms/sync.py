"""Synchronous SGD: gradients averaged over all workers after every backward pass.

Each worker's gradient is a mean over its own batch; weighting it by the batch's rows before
the sum makes the result the exact mean over the global batch even when the last batches of
an epoch differ by a row. N workers with batch b therefore take the steps of one worker
with batch N*b. Every replica and its optimizer state are the same, so a resume on another number
of workers gives every worker rank 0's.
"""

from __future__ import annotations

import torch

from shoal.algorithms.collective import CollectiveAlgorithm
from shoal.cluster.collectives import FlatBuffer


class SynchronousSGD(CollectiveAlgorithm):
    """Synchronous SGD: gradients averaged over all workers after every backward pass."""

    name = "sync"

    def setup(self, model, optimizer, comm) -> None:
        super().setup(model, optimizer, comm)
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.gradients = FlatBuffer(self.parameters, extra=1)  # the last slot carries the rows
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.buffer_flat = FlatBuffer(self.buffers) if self.buffers else None

    def after_backward(self, rows: int) -> None:
        if self.comm.world_size == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.parameters]
        flat = self.gradients.pack(grads)
        flat[:-1].mul_(rows)
        flat[-1] = rows
        self.comm.all_reduce_sum_(flat)
        flat[:-1].div_(flat[-1])
        for parameter, gradient in zip(self.parameters, grads):
            if parameter.grad is None:
                parameter.grad = gradient
        self.gradients.unpack_(grads)

    def end_epoch(self, epoch: int) -> None:
        # Parameters never diverge, but batch-norm statistics are local: share them for evaluation.
        if self.buffer_flat is not None and self.comm.world_size > 1:
            self.comm.all_reduce_mean_(self.buffer_flat.pack())
            self.buffer_flat.unpack_()
