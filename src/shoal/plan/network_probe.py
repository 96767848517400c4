"""Measure the network between machines with the job's own transport: torch.distributed over gloo.

Two ranks, started on two hosts through the cluster's remote command (`ssh {host}`) or both on
this machine, time point-to-point messages (a ping-pong, halved) and all-reduces at a few sizes.
A straight line through each set of points gives the link as the planner prices it: a fixed cost
per message (the wire's latency plus the software's per-message work) and a bandwidth. Rank 0
prints the measurements as one JSON line.

    python -m shoal.plan.network_probe --rank R --address HOST0 --peer OTHER --port P   # on each host
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import numpy as np

from shoal.cluster.interface import interface_to
from shoal.errors import ShoalError
from shoal.plan.costs import Link, ring_all_reduce

SIZES = (4096, 65536, 262144, 1048576)  # bytes
PROBE_SECONDS = 0.5  # per size and pattern, after warm-up
MAX_REPEATS = 200
PROBE_TIMEOUT = 300.0


def repeat(work, seconds: float) -> float:
    """The median seconds of `work`, called until `seconds` have passed (at least 3 times, after one warm-up)."""
    work()
    samples, began = [], time.perf_counter()
    while len(samples) < 3 or (time.perf_counter() - began < seconds and len(samples) < MAX_REPEATS):
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def measure(rank: int, sizes: tuple[int, ...], seconds: float) -> dict:
    """Per size: one message's seconds (half a ping-pong) and an all-reduce's, on the group already set up."""
    import torch
    import torch.distributed as dist

    results = {"message": {}, "all_reduce": {}}
    for size in sizes:
        buffer = torch.zeros(max(size // 4, 1))

        def ping_pong() -> None:
            if rank == 0:
                dist.send(buffer, 1)
                dist.recv(buffer, 1)
            else:
                dist.recv(buffer, 0)
                dist.send(buffer, 0)

        results["message"][size] = repeat(ping_pong, seconds) / 2
        dist.barrier()
        results["all_reduce"][size] = repeat(lambda: dist.all_reduce(buffer), seconds)
        dist.barrier()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shoal.plan.network_probe")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--address", required=True, help="where rank 0 listens")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--peer", required=True, help="the other rank's host: gloo talks on the interface reaching it")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--seconds", type=float, default=PROBE_SECONDS)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    interface = interface_to(args.peer)  # the hostname may resolve to loopback here (stock Debian's)
    if interface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
    store = dist.TCPStore(args.address, args.port, 2, is_master=args.rank == 0,
                          timeout=timedelta(seconds=PROBE_TIMEOUT))
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=2,
                            timeout=timedelta(seconds=PROBE_TIMEOUT))
    try:
        results = measure(args.rank, tuple(int(size) for size in args.sizes.split(",")), args.seconds)
    finally:
        dist.destroy_process_group()
    if args.rank == 0:
        print(json.dumps(results), flush=True)
    return 0


def fit(points: dict, rounds_and_chunk) -> Link:
    """A link through measured (bytes -> seconds) points: seconds = rounds x (latency + chunk / bandwidth),
    least squares; a fixed cost below zero (noise at small sizes) is taken as zero."""
    sizes = sorted(int(size) for size in points)
    rows = [rounds_and_chunk(size) for size in sizes]
    design = np.array([[rounds, rounds * chunk] for rounds, chunk in rows])
    seconds = np.array([points[size] if size in points else points[str(size)] for size in sizes])
    (latency, inverse_bandwidth), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    if latency < 0:  # refit through the origin
        inverse_bandwidth = float(design[:, 1] @ seconds / (design[:, 1] @ design[:, 1]))
        latency = 0.0
    return Link(latency=float(latency), bandwidth=1.0 / max(float(inverse_bandwidth), 1e-12))


def links(results: dict) -> tuple[Link, Link]:
    """(the ring's link, fitted to the all-reduces of 2 ranks; the point-to-point link)."""
    def ring(size: int) -> tuple[int, float]:
        exchange = ring_all_reduce(size, 2)
        return exchange.rounds, exchange.size

    return fit(results["all_reduce"], ring), fit(results["message"], lambda size: (1, size))


def run_pair(commands: list[list[str]], where: str, timeout: float = PROBE_TIMEOUT) -> dict:
    """Start both ranks' commands; rank 0's JSON line, or one line saying which side failed."""
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  stdin=subprocess.DEVNULL) for command in commands]
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        raise ShoalError(f"{where}: the network probe did not finish in {timeout:.0f} s") from None
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for rank, (process, (_, error)) in enumerate(zip(processes, outputs)):
        if process.returncode != 0:
            last = (error.strip().splitlines() or ["no output"])[-1]
            raise ShoalError(f"{where}: the network probe's rank {rank} failed: {last}")
    return json.loads(outputs[0][0].strip().splitlines()[-1])


def probe_command(rank: int, address: str, peer: str, port: int, seconds: float = PROBE_SECONDS) -> list[str]:
    return [sys.executable, "-m", "shoal.plan.network_probe", "--rank", str(rank), "--address", address,
            "--peer", peer, "--port", str(port), "--seconds", str(seconds)]


if __name__ == "__main__":
    sys.exit(main())
