"""One host's side of the raw exchanges benchmarks/step_cost.py sets beside shoal's steps: gloo and nothing else.

For each size (fp32 numbers: a model's gradients), two ranks over gloo time, one operation at a time
after a barrier: the all-reduce (sum) of one flat tensor, what an exchange of `sync` without overlap
moves after the backward pass, and a round trip, rank 1 sending the tensor to rank 0 and receiving
as many bytes back, what a parameter-server trainer's update and reply move. The first operations of
each kind are left out (gloo's connections and buffers warm up). Each rank writes its timings (seconds,
in order) as JSON: rank 1's round trips are the ones timed whole.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as distributed

WARM_UP = 2


def timed(operation, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of `operation`, each started after a barrier."""
    for _ in range(WARM_UP):
        operation()
    seconds = []
    for _ in range(repeats):
        distributed.barrier()
        began = time.perf_counter()
        operation()
        seconds.append(time.perf_counter() - began)
    return seconds


def round_trip(tensor: torch.Tensor, rank: int) -> None:
    if rank == 1:
        distributed.send(tensor, 0)
        distributed.recv(tensor, 0)
    else:
        distributed.recv(tensor, 1)
        distributed.send(tensor, 1)


def measure(numbers: list[int], repeats: int, rank: int) -> dict:
    found = {}
    for count in numbers:
        tensor = torch.zeros(count, dtype=torch.float32)
        found[str(count)] = {"all_reduce": timed(functools.partial(distributed.all_reduce, tensor), repeats),
                             "round_trip": timed(functools.partial(round_trip, tensor, rank), repeats)}
    return found


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True, choices=(0, 1))
    parser.add_argument("--address", required=True, help="rank 0's address: the rendezvous")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--interface", help="gloo's network interface (GLOO_SOCKET_IFNAME)")
    parser.add_argument("--numbers", required=True, help="comma-separated counts of fp32 numbers, one per size")
    parser.add_argument("--repeats", type=int, default=10, help="timed operations of each kind and size")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds an operation may wait")
    parser.add_argument("--out", required=True, help="this rank's JSON result")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.interface:
        os.environ["GLOO_SOCKET_IFNAME"] = args.interface
    torch.set_num_threads(1)
    distributed.init_process_group("gloo", init_method=f"tcp://{args.address}:{args.port}", rank=args.rank,
                                   world_size=2, timeout=timedelta(seconds=args.timeout))
    numbers = [int(count) for count in args.numbers.split(",")]
    result = {"rank": args.rank, "sizes": measure(numbers, args.repeats, args.rank)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
