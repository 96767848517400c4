"""shoal's gradient exchange against DDP's in the same two processes: is the gap to DDP in the exchange itself?

benchmarks/step_cost.py compares whole runs, minutes apart, whose seconds a step move by 20-40% between
runs on this project's VMs; a few percent between shoal's sync and DDP cannot be told there. Here two
processes on 2 emulated hosts (tests/cluster/hosts.py: each its own core, a tbf-shaped 1 Gbit/s link)
hold the same model (benchmarks/comm_models.py) three times over and train each copy in turn, in blocks
of `--steps` steps, the order rotated every round, on the same rows already in memory:

- ddp: torch's DistributedDataParallel (its reducer all-reduces buckets from autograd hooks);
- shoal: shoal's own `sync` exchange (shoal.algorithms.exchange.GradientExchange, exact, no overlap, as
  "auto" chooses on a one-core host: the rows count rides in the one flat sum, which for two ranks and up
  to 1 MiB is shoal.cluster.pair_sum's exchange, else gloo's all-reduce);
- pair: the gradients flattened and sent each way at once (torch's batch_isend_irecv), each side adding
  what it got: one message latency where gloo's two-rank ring takes two (the same bytes each way).

Reported per variant: the median over rounds of each block's median step, and each block's mean. Rank
1's timings; both ranks take every step together. A step is zero_grad, forward, loss, backward, the
exchange, the optimizer's step and the loss read back (`.item()`), as shoal's loop does.

    .venv/bin/python -m benchmarks.exchange_ab                      # the four models, about 6 minutes
    .venv/bin/python -m benchmarks.exchange_ab --models perceptron --rounds 12
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

VARIANTS = ("ddp", "shoal", "pair")
BATCH = 128
ROWS = 2560
PORT = 29870


def build(variant: str, model_name: str, rank: int):
    """A model (the same start in every variant), its optimizer, and shoal's exchange where the variant uses it."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from benchmarks.comm_models import build as build_model
    from shoal.algorithms.compression import Exact
    from shoal.algorithms.exchange import GradientExchange, Route
    from shoal.cluster.collectives import Communicator

    torch.manual_seed(0)
    model = build_model(model_name)
    exchange = None
    if variant == "ddp":
        model = DistributedDataParallel(model)
    elif variant == "shoal":
        comm = Communicator(rank, 2)
        exchange = GradientExchange(list(model.parameters()), comm, Route(comm.detached()), Exact(),
                                    capacity=1 << 40, overlap=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, optimizer, exchange


def pair_mean(model, rank: int) -> None:
    """The gradients' mean over both ranks, sent each way at once."""
    import torch
    import torch.distributed as distributed

    parameters = list(model.parameters())
    flat = torch.cat([parameter.grad.reshape(-1) for parameter in parameters])
    other = torch.empty_like(flat)
    works = distributed.batch_isend_irecv([distributed.P2POp(distributed.isend, flat, 1 - rank),
                                           distributed.P2POp(distributed.irecv, other, 1 - rank)])
    for work in works:
        work.wait()
    flat.add_(other).div_(2)  # a + b is b + a, bit for bit: both ranks hold the same mean
    offset = 0
    for parameter in parameters:
        parameter.grad.copy_(flat[offset : offset + parameter.numel()].view_as(parameter))
        offset += parameter.numel()


def block(variant: str, held, inputs, targets, steps: int, rank: int) -> list[float]:
    """Seconds of each of `steps` steps of one variant, after a barrier."""
    import torch
    import torch.distributed as distributed

    model, optimizer, exchange = held
    loss_function = torch.nn.CrossEntropyLoss()
    distributed.barrier()
    seconds = []
    for step in range(steps):
        start = (step * BATCH) % (ROWS - BATCH)
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_function(model(inputs[start : start + BATCH]), targets[start : start + BATCH])
        if exchange is not None:
            exchange.begin(float(BATCH), BATCH, True)
        loss.backward()
        if exchange is not None:
            exchange.finish()
        elif variant == "pair":
            pair_mean(model, rank)
        optimizer.step()
        loss.item()
        seconds.append(time.perf_counter() - began)
    return seconds


def rank_main(args: argparse.Namespace) -> int:
    """One host's side: every model, every variant, in rotated rounds; rank 1 writes the timings."""
    import torch
    import torch.distributed as distributed

    from benchmarks.comm_models import MODELS

    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    torch.set_num_threads(1)
    distributed.init_process_group("gloo", init_method=f"tcp://{args.address}:{args.port}", rank=args.rank,
                                   world_size=2, timeout=timedelta(seconds=300))
    found = {}
    for model_name in args.models:
        torch.manual_seed(1)
        inputs = torch.randn(ROWS, *MODELS[model_name]["input"])
        targets = torch.randint(0, 10, (ROWS,))
        held = {variant: build(variant, model_name, args.rank) for variant in VARIANTS}
        for variant in VARIANTS:
            block(variant, held[variant], inputs, targets, 5, args.rank)  # gloo's buffers and the caches warm
        found[model_name] = {variant: [] for variant in VARIANTS}
        for number in range(args.rounds):
            shift = number % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                found[model_name][variant].append(block(variant, held[variant], inputs, targets, args.steps,
                                                        args.rank))
    if args.rank == 1:
        Path(args.out).write_text(json.dumps(found))
    distributed.barrier()
    # torch 2.13's gloo can abort in its teardown ("terminate called without an active exception", as the hand
    # DDP loop of benchmarks/comm_ddp.py sometimes does): the timings are written, so end without it
    sys.stdout.flush()
    os._exit(0)


def report(found: dict, args: argparse.Namespace, minutes: float) -> str:
    from benchmarks.comm_models import parameters
    from benchmarks.common import machine_line

    lines = [f"""# shoal's gradient exchange against DDP's, in the same two processes

{machine_line()}. 2 emulated hosts, each its own core, 1 thread, a 1 Gbit/s tbf link. Per model, {args.rounds}
rounds of one block of {args.steps} steps of each variant, in rotated order; batch {BATCH}, SGD lr 0.05 momentum 0.9,
random rows in memory. "step": the median over rounds of each block's median step; "x DDP" its ratio to
DDP's; "blocks": each block's mean step, in round order.
`{' '.join(['python -m benchmarks.exchange_ab', *sys.argv[1:]])}` ({minutes:.1f} minutes).
"""]
    for model_name, variants in found.items():
        ddp = statistics.median(statistics.median(block) for block in variants["ddp"])
        lines += [f"## {model_name} ({parameters(model_name):,} parameters)", "",
                  "| variant | step (ms) | x DDP | blocks (mean ms) |", "| --- | ---: | ---: | --- |"]
        for variant, blocks in variants.items():
            step = statistics.median(statistics.median(block) for block in blocks)
            means = ", ".join(f"{1000 * statistics.mean(block):.2f}" for block in blocks)
            lines.append(f"| {variant} | {1000 * step:.2f} | {step / ddp:.3f}x | {means} |")
        lines.append("")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="perceptron,cnn,cnn-dense,mlp", help="of benchmarks/comm_models.py")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100, help="steps a block (the MLP: a fifth of them)")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # set on each host by the benchmark itself
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=PORT, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.models = [name.strip() for name in args.models.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.rank is not None:
        return rank_main(args)
    from tests.cluster.hosts import EmulatedCluster, missing_requirements

    from benchmarks import comm
    from benchmarks.common import machine, write_result

    reason = missing_requirements(2)
    if reason:
        sys.exit(f"benchmarks.exchange_ab: {reason}")
    began, found = time.monotonic(), {}
    with EmulatedCluster(hosts=2, rate="1gbit") as cluster:
        out = cluster.shared / "exchange-ab.json"
        logs = [cluster.shared / f"exchange-ab-host{host}.log" for host in range(2)]
        for model_name in args.models:
            steps = max(args.steps // 5, 10) if model_name == "mlp" else args.steps
            command = [sys.executable, "-m", "benchmarks.exchange_ab", "--models", model_name, "--rounds",
                       str(args.rounds), "--steps", str(steps), "--address", cluster.address(0), "--port",
                       str(args.port + len(found)), "--out", str(out)]
            launchers = [cluster.start(host, [*command, "--rank", str(host)], env=comm.environment(), log=logs[host])
                         for host in range(2)]
            codes = comm.wait(cluster, launchers)
            if any(code != 0 for code in codes):
                comm.keep_logs(logs)
                sys.exit(f"benchmarks.exchange_ab: {model_name}: {comm.failure(codes, logs)}")
            found.update(json.loads(out.read_text()))
            print(f"{model_name}: done ({time.monotonic() - began:.0f} s)", flush=True)
    markdown = report(found, args, (time.monotonic() - began) / 60)
    print(markdown)
    print(f"written: {write_result('exchange-ab', markdown, {'machine': machine(), 'timings': found})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
