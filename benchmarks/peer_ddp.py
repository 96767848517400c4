"""A hand-written PyTorch DistributedDataParallel trainer: the baseline a user would write without shoal.

benchmarks/peers.py runs it beside shoal on the same arrays and cores. It uses nothing of shoal's
training code: N processes from torch.multiprocessing, gloo on 127.0.0.1, the model wrapped in
DistributedDataParallel (gradients all-reduced every step), each rank training on its contiguous
1/N share of the rows with its own shuffling. Batches are index slices of in-memory tensors (no
DataLoader), so the comparison is about the framework, not about per-sample Python. Each epoch is
timed between two barriers; rank 0 then evaluates on the test set and writes a JSON result.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as distributed
import torch.multiprocessing as multiprocessing
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from benchmarks.peer_arguments import load_arrays, peer_parser

ACTIVATIONS = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}


def build_model(features: int, hidden: int, classes: int, activation: str, dropout: float) -> nn.Module:
    layers = [nn.Linear(features, hidden), ACTIVATIONS[activation]()]
    if dropout > 0:
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(hidden, classes))
    return nn.Sequential(*layers)


def share(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rows [start, stop) of `rank`: contiguous, the first rows % world_size ranks one row longer."""
    base, extra = divmod(rows, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ddp_epoch(model, optimizer, loss_function, inputs: torch.Tensor, targets: torch.Tensor, order: torch.Tensor,
              steps: int, batch_size: int) -> tuple[float, float, float]:
    """One epoch of a DDP model between barriers, so every rank starts and ends it together: when it started
    (unix seconds), its seconds and its mean training loss."""
    model.train()
    total = torch.zeros(())
    distributed.barrier()
    began, started = time.perf_counter(), time.time()
    for step in range(steps):
        index = order[step * batch_size : (step + 1) * batch_size]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_function(model(inputs[index]), targets[index])
        loss.backward()
        optimizer.step()
        total += loss.detach()
    distributed.barrier()
    return started, time.perf_counter() - began, total.item() / steps


def train_rank(rank: int, world_size: int, port: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                   timeout=timedelta(seconds=args.timeout))
    data = Path(args.data)
    meta = json.loads((data / "meta.json").read_text())
    features, labels = load_arrays(data, "train", mmap=True)
    start, stop = share(len(features), world_size, rank)
    inputs = torch.from_numpy(np.ascontiguousarray(features[start:stop]))
    targets = torch.from_numpy(np.ascontiguousarray(labels[start:stop]))

    # DistributedDataParallel broadcasts rank 0's initial weights; a seed per rank gives each its own dropout masks.
    torch.manual_seed(args.seed + rank)
    model = DistributedDataParallel(build_model(features.shape[1], args.hidden, meta["classes"], args.activation,
                                                args.dropout))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-8)
    loss_function = nn.CrossEntropyLoss()
    # Every rank must run the same number of steps, or the all-reduce of the longer one waits forever.
    steps = math.ceil((len(features) // world_size) / args.batch_size)

    seconds, losses, started = [], [], None
    for epoch in range(args.epochs):
        order = torch.from_numpy(np.random.default_rng([args.seed, epoch, rank]).permutation(len(inputs)))
        epoch_started, epoch_seconds, loss = ddp_epoch(model, optimizer, loss_function, inputs, targets, order, steps,
                                                       args.batch_size)
        started = started or epoch_started
        seconds.append(epoch_seconds)
        losses.append(loss)

    if rank == 0:
        test_features, test_labels = (torch.from_numpy(values) for values in load_arrays(data, "test"))
        model.eval()
        with torch.no_grad():
            predicted = torch.cat([model.module(chunk).argmax(1) for chunk in test_features.split(8192)])
        result = {"system": "ddp", "workers": world_size, "threads": args.threads, "epochs_run": args.epochs,
                  "epoch_seconds": seconds, "train_loss": losses, "training_started": started,
                  "accuracy": (predicted == test_labels).double().mean().item(), "steps_per_epoch": steps}
        Path(args.out).write_text(json.dumps(result, indent=1))
    distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = peer_parser(__doc__)
    parser.add_argument("--workers", type=int, default=2, help="processes, one rank each")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--activation", choices=sorted(ACTIVATIONS), required=True)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, required=True, help="rows per step on each rank")
    parser.add_argument("--lr", type=float, default=0.001, help="Adam's learning rate")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a collective may wait")
    args = parser.parse_args(argv)
    # Children inherit these before they import torch: no rank starts more threads than it is given.
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(args.threads)
    multiprocessing.spawn(train_rank, args=(args.workers, free_port(), args), nprocs=args.workers, join=True)


if __name__ == "__main__":
    main()
