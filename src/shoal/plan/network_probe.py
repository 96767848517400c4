"""Measure the network between machines with the job's own transport: torch.distributed over gloo.

Two ranks, started on two hosts through the cluster's remote command (`ssh {host}`) or both on
this machine, time all-reduces and point-to-point messages (a ping-pong as a trainer and its server
exchange, halved; left out when no parameter server is planned) at a few sizes, each after a compute
burst as a training step would send them, and compare the hosts' speed.
A straight line through each set of points (least squares over the sizes, from a few pages to twice
the model's bytes) gives the link as the planner prices it: a fixed cost per message (the wire's
latency plus the software's per-message work, a waiting process woken among it) and the rate the
exchange reached. Rank 0 prints the measurements as one JSON line.

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
from shoal.plan.cpu_quota import least_window

SMALLEST = 4096  # bytes
PROBE_SECONDS = 0.5  # per size and pattern, after warm-up
MAX_REPEATS = 200
# Bytes each direction carries at least, per size and pattern. A slow link's queue drops packets of a burst
# now and then (10 Mbit/s here: 1 in 10 of a 127 kB message's), and each loss stalls its message by a
# retransmission: 127 kB round trips timed for 0.5 s (3 of them) averaged 106 to 155 ms from one probe to
# the next, for 5 s 123 ms, what a Downpour trainer pays. 4 MB is 3 s on 10 Mbit/s, within 0.5 s from 100.
TRAFFIC_BYTES = 4_000_000
PROBE_TIMEOUT = 300.0


def repeat(work, seconds: float, least: int = 3) -> float:
    """The mean seconds of `work`, called as often as fit in `seconds` (at least `least` times, after a
    warm-up).
    The mean, not the median: an epoch is a sum of steps, so the occasional stall (a thread that waits a
    scheduler's turn) costs it what it costs the mean. Both ranks agree on the count (the larger of their
    first timings decides), so collectives stay paired."""
    import torch
    import torch.distributed as dist

    work()
    began = start = time.perf_counter()
    work()
    samples = [time.perf_counter() - start]  # warm already: on a 10 Mbit/s link a call of 1 MB each way is 2 s
    first = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(first, op=dist.ReduceOp.MAX)
    count = int(min(max(seconds / max(first.item(), 1e-6), least), MAX_REPEATS))
    window, rounds = least_window(1), count - 1
    while rounds:
        for _ in range(rounds):
            start = time.perf_counter()
            work()
            samples.append(time.perf_counter() - start)
        # under a CPU quota, as many more rounds as make each rank's calls span its window: a count from a first
        # call that ran within a turn (or waited out a pause) can end after three of them. The ranks' largest
        # shortfall decides, so both go on or stop together.
        shortfall = torch.tensor([window - (time.perf_counter() - began)], dtype=torch.float64)
        dist.all_reduce(shortfall, op=dist.ReduceOp.MAX)
        rounds = count if shortfall.item() > 0 else 0
    return float(np.mean(samples))


BURST_PRODUCTS = 12  # 128 x 128 matrix products: about a millisecond of one core


def work_burst():
    """A fixed compute burst (matrix products, about a millisecond), standing in for a training step: the
    same work on every host, so its time compares their processors too."""
    import torch

    left, right = torch.randn(128, 128), torch.randn(128, 128)

    def burst() -> None:
        for _ in range(BURST_PRODUCTS):
            torch.mm(left, right)

    return burst


PACE_ROUNDS = 5  # side-by-side rounds of the burst; their median ratio is the pace


def measure(rank: int, sizes: tuple[int, ...], seconds: float, messages: bool = True) -> dict:
    """Per size, what an exchange costs a step on a busy worker, where the kernel's network work takes turns
    with the computation on the same core: an all-reduce's seconds and (with `messages`, for a parameter
    server's plan) one message's (half a ping-pong), each right after a compute burst, less the burst's own
    time. And the hosts' pace: the burst's time on each host over rank 0's, both timed at once."""
    import torch.distributed as dist

    burst = work_burst()
    alone, pace = side_by_side(burst, seconds)
    results = {"loaded_message": {}, "loaded_all_reduce": {}, "pace": pace}
    for size in sizes:
        measure_size(rank, size, burst, (alone, alone * pace), seconds, results, messages)
        dist.barrier()
    return results


def side_by_side(burst, seconds: float) -> tuple[float, float]:
    """(this rank's burst seconds, the slowest rank's over rank 0's). Each round times the burst on both
    hosts at once, so a VM's cores drifting from one minute to the next (10-20% here) move both; each rank's
    median over the rounds keeps one slow moment out, and the slowest median over rank 0's is the pace (a
    median of each round's slowest over rank 0's read two even hosts as 1.08-1.18 apart: the larger of two
    noisy timings is the larger on average). A round lasts `seconds` / 2 of wall time, and under a CPU quota
    its periods' TURNS (shoal.plan.cpu_quota): a round of a fixed count of bursts could end after three."""
    import torch
    import torch.distributed as dist

    window = max(seconds / 2, least_window(1))
    rounds = []
    for _ in range(PACE_ROUNDS):
        both = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
        dist.all_gather(both, torch.tensor([mean_over(burst, window)], dtype=torch.float64))
        rounds.append([float(each) for each in both])
    medians = [float(np.median(column)) for column in zip(*rounds, strict=True)]
    return medians[dist.get_rank()], max(medians) / medians[0]


def mean_over(work, seconds: float) -> float:
    """The mean seconds of `work`, called for `seconds` of wall time (at least once, after a warm-up call)."""
    from shoal.plan.compute_probe import timed

    return float(np.mean(timed(work, seconds, at_least=1, warm_up=1)))


def measure_size(rank: int, size: int, burst, bursts: tuple[float, float], seconds: float, results: dict,
                 messages: bool) -> None:
    """One size's figures into `results`: an all-reduce and (with `messages`) a message, each after a burst, less
    the burst's seconds (`bursts`: rank 0's and the slowest rank's, timed side by side)."""
    import torch
    import torch.distributed as dist

    buffer = torch.zeros(max(size // 4, 1))

    def ping_pong() -> None:
        if rank == 0:
            dist.send(buffer, 1)
            dist.recv(buffer, 1)
        else:
            dist.recv(buffer, 0)
            buffer.sum()  # a server reads the update before it answers (see below)
            dist.send(buffer, 0)

    # A trainer computes, then sends and waits; its server waits, reads the update, answers: rank 0 alone
    # bursts. Answering the very moment a receive returns stalls gloo on one-core hosts (a 127 kB round trip
    # on 1 Gbit/s: 4.7 ms on average, half of them 7.4; any work between, even 5 µs, gives 2.2 ms, against
    # 2.0 on the wire), and no server answers without reading what it got.
    least = max(3, -(-TRAFFIC_BYTES // size))  # a ping-pong, like a 2-rank all-reduce, sends `size` each way
    alone, slowest = bursts
    if messages:
        loaded = repeat(lambda: (burst() if rank == 0 else None, ping_pong()), seconds, least)
        # never below zero: `alone` is timed with both ranks at work, and two hosts sharing a machine slow each
        # other (1.04-1.29x on a 2-core VM), so rank 0's burst alone can beat it by more than a small message
        results["loaded_message"][size] = max((loaded - alone) / 2, 0.0)
    reduced = repeat(lambda: (burst(), dist.all_reduce(buffer)), seconds, least)
    # an all-reduce ends after the slowest rank's burst, whose pace the plan prices in compute: not twice
    results["loaded_all_reduce"][size] = max(reduced - slowest, 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shoal.plan.network_probe")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--address", required=True, help="where rank 0 listens")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--peer", required=True, help="the other rank's host: gloo talks on the interface reaching it")
    parser.add_argument("--sizes", required=True, help="message sizes in bytes, like 4096,65536")
    parser.add_argument("--seconds", type=float, default=PROBE_SECONDS)
    parser.add_argument("--no-messages", action="store_true",
                        help="time all-reduces only (no parameter server is planned): on a slow link half the time")
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
        results = measure(args.rank, tuple(int(size) for size in args.sizes.split(",")), args.seconds,
                          messages=not args.no_messages)
    finally:
        dist.destroy_process_group()
    if args.rank == 0:
        print(json.dumps(results), flush=True)
    return 0


def fit(points: dict, rounds_and_chunk) -> Link:
    """A link through measured (bytes -> seconds) points: seconds = rounds x (latency + chunk / bandwidth),
    least squares over the sizes, which prices every exchange (a message's fixed cost and its bytes over the
    rate apart); a fixed cost below zero (noise at small sizes) is taken as zero. Where the cost did not grow
    with size (loopback, whose copies hide in the per-message work), the bandwidth is the largest message's
    bytes over its seconds, what the link was seen to carry, not an unbounded guess, and the fixed cost the
    least-squares one beside it. The per-message points are kept with the link, to show."""
    sizes = sorted(int(size) for size in points)
    rows = [rounds_and_chunk(size) for size in sizes]
    design = np.array([[rounds, rounds * chunk] for rounds, chunk in rows], dtype=float)
    seconds = np.array([points[size] if size in points else points[str(size)] for size in sizes], dtype=float)
    (latency, inverse_bandwidth), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    if latency < 0:  # refit through the origin
        inverse_bandwidth = float(design[:, 1] @ seconds / (design[:, 1] @ design[:, 1]))
        latency = 0.0
    per_message = tuple(sorted((int(chunk), float(total / rounds)) for (rounds, chunk), total in zip(rows, seconds)))
    if inverse_bandwidth <= 0:
        largest, largest_seconds = per_message[-1]
        inverse_bandwidth = max(largest_seconds, 1e-9) / largest
        left = seconds - design[:, 1] * inverse_bandwidth  # what the bandwidth leaves to the fixed cost
        latency = max(float(design[:, 0] @ left / (design[:, 0] @ design[:, 0])), 0.0)
    return Link(latency=float(latency), bandwidth=1.0 / float(inverse_bandwidth), points=per_message)


def links(results: dict) -> tuple[Link, Link | None]:
    """(the ring's link, fitted to the all-reduces of 2 ranks; the point-to-point link, None when not
    measured), both as a busy worker pays them: measured right after a compute burst, the burst's own time
    taken off."""
    def ring(size: int) -> tuple[int, float]:
        exchange = ring_all_reduce(size, 2)
        return exchange.rounds, exchange.size

    messages = results.get("loaded_message")
    return fit(results["loaded_all_reduce"], ring), fit(messages, lambda size: (1, size)) if messages else None


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


def probe_sizes(message: int) -> list[int]:
    """Sizes around what the job sends (a model's weights or gradients): from a few pages to twice that."""
    return sorted({SMALLEST, max(message // 4, SMALLEST), max(message, SMALLEST), max(2 * message, 2 * SMALLEST)})


def probe_command(rank: int, address: str, peer: str, port: int, sizes: list[int],
                  seconds: float = PROBE_SECONDS, messages: bool = True) -> list[str]:
    return [sys.executable, "-m", "shoal.plan.network_probe", "--rank", str(rank), "--address", address,
            "--peer", peer, "--port", str(port), "--sizes", ",".join(map(str, sizes)), "--seconds", str(seconds),
            *([] if messages else ["--no-messages"])]


if __name__ == "__main__":
    sys.exit(main())
