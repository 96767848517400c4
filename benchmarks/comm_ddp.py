"""One rank of PyTorch DistributedDataParallel over gloo across machines: benchmarks/comm.py's baseline.

benchmarks/comm.py starts it on each emulated host beside shoal's runs of the same model (built from the
same layer list, benchmarks/comm_models.py), data, batch and optimizer. It uses nothing of shoal's
training code: each rank reads its contiguous 1/N share of the rows from shoal's dataset once (scaled as
shoal's loader scales them), shuffles it every epoch and takes index slices of in-memory tensors; the
gradients go through DDP's buckets, plain or through one of torch's communication hooks (fp16
compression, PowerSGD), or, with `--hook none` on one rank alone, straight to the optimizer: the hand-written
single-process loop (benchmarks/step_cost.py's compute floor). Each epoch is timed between two barriers;
rank 0 then evaluates on the test set.
Every rank writes a JSON result; one that fails writes the error instead, so the baseline's failures (as
PowerSGD's hook on gloo) are recorded rather than lost.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as distributed
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from benchmarks.comm_models import MODELS, build
from benchmarks.peer_ddp import ddp_epoch, share
from shoal.data.format import open_dataset
from shoal.data.loader import feature_scale

HOOKS = ("plain", "fp16", "powersgd", "none")


def tensors(path: str, start: int | None, stop: int | None, shape: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [start, stop) of a shoal dataset (all of them when None) as float features shaped for the model."""
    dataset = open_dataset(path)
    features, labels = dataset.read_rows(start or 0, dataset.rows if stop is None else stop)
    scaled = features.astype(np.float32).reshape(len(features), *shape) * np.float32(feature_scale(features.dtype))
    return torch.from_numpy(scaled), torch.from_numpy(labels.astype(np.int64))


def wrap(model: nn.Module, hook: str, rank: int) -> nn.Module:
    if hook == "none":  # one rank alone, no DDP: the plain PyTorch loop
        return model
    wrapped = DistributedDataParallel(model)
    if hook == "fp16":
        wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        # PowerSGD starts after DDP's first two steps at the earliest (its error feedback needs them).
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                            start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
        wrapped.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return wrapped


def train(args: argparse.Namespace) -> dict:
    shape = MODELS[args.model]["input"]
    rows = open_dataset(args.train).rows
    start, stop = share(rows, args.world_size, args.rank)
    inputs, targets = tensors(args.train, start, stop, shape)
    torch.manual_seed(args.seed)  # DDP broadcasts rank 0's initial weights
    model = wrap(build(args.model), args.hook, args.powersgd_rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_function = nn.CrossEntropyLoss()
    # Every rank takes the same number of steps, or the longer one's all-reduce waits forever.
    steps = math.ceil((rows // args.world_size) / args.batch_size)
    seconds, losses = [], []
    for epoch in range(args.epochs):
        order = torch.from_numpy(np.random.default_rng([args.seed, epoch, args.rank]).permutation(len(inputs)))
        _, epoch_seconds, loss = ddp_epoch(model, optimizer, loss_function, inputs, targets, order, steps,
                                           args.batch_size)
        seconds.append(epoch_seconds)
        losses.append(loss)
        print(f"rank {args.rank} epoch {epoch + 1}: {seconds[-1]:.2f} s, loss {losses[-1]:.4f}", flush=True)
    result = {"rank": args.rank, "hook": args.hook, "epoch_seconds": seconds, "train_loss": losses,
              "steps_per_epoch": steps}
    if args.rank == 0:
        test_inputs, test_targets = tensors(args.test, None, None, shape)
        model.eval()
        with torch.no_grad():
            plain = getattr(model, "module", model)
            predicted = torch.cat([plain(chunk).argmax(1) for chunk in test_inputs.split(4096)])
        result["accuracy"] = (predicted == test_targets).double().mean().item()
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--address", required=True, help="rank 0's address: the rendezvous")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--interface", help="gloo's network interface (GLOO_SOCKET_IFNAME)")
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--train", required=True, help="a shoal dataset; each rank takes its 1/N")
    parser.add_argument("--test", required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True, help="rows per step on each rank")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--momentum", type=float, required=True)
    parser.add_argument("--hook", choices=HOOKS, default="plain")
    parser.add_argument("--powersgd-rank", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a collective may wait")
    parser.add_argument("--out", required=True, help="this rank's JSON result")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.hook == "none" and args.world_size != 1:
        raise SystemExit("benchmarks.comm_ddp: --hook none is the loop of one rank alone (--world-size 1)")
    if args.interface:
        os.environ["GLOO_SOCKET_IFNAME"] = args.interface
    torch.set_num_threads(args.threads)
    distributed.init_process_group("gloo", init_method=f"tcp://{args.address}:{args.port}", rank=args.rank,
                                   world_size=args.world_size, timeout=timedelta(seconds=args.timeout))
    try:
        result = train(args)
    except Exception as error:  # the baseline's failure is a result too
        message = str(error).strip().splitlines()
        Path(args.out).write_text(json.dumps({"rank": args.rank, "hook": args.hook,
                                              "error": f"{type(error).__name__}: {message[0] if message else ''}"}))
        print(f"rank {args.rank} failed: {error}", file=sys.stderr, flush=True)
        os._exit(1)  # the other rank may be stuck in a collective: no orderly shutdown
    Path(args.out).write_text(json.dumps(result, indent=1))
    distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
