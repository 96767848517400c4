"""Updates per second a Downpour parameter server sustains against model size (10k to 10M parameters).

No data, no forward pass and no CLI: N local processes joined by gloo run shoal's Downpour
directly. Rank 0 serves (`serve_epoch`); every trainer sets each parameter's gradient to a
random tensor drawn once, then calls the hooks the training loop calls (`after_backward`,
`step`, `after_step`), so each step is one update sent and one reply received. What is
measured is therefore only the protocol (one flat message each way) and the server's optimizer
step. The model is a stack of equal Linear layers sized to the target parameter count. The
server's time per update is split into receive (which includes waiting for a trainer to send),
apply (bookkeeping, gradients into place, the optimizer's step), pack (weights into the reply)
and send.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as multiprocessing
from torch import nn

from benchmarks.common import machine, machine_line, write_result
from shoal.algorithms.downpour import Downpour, DownpourOptions
from shoal.cluster.collectives import Communicator

BATCH = 128  # the rows each synthetic update claims to average over; weighs nothing here


class TimedDownpour(Downpour):
    """Downpour whose server adds up the seconds spent in each part of an update."""

    def reset_timers(self) -> None:
        self.timings = {"receive": 0.0, "apply": 0.0, "pack": 0.0, "send": 0.0}

    def receive_update(self, copy: bool = True):
        began = time.perf_counter()
        result = super().receive_update(copy)
        self.timings["receive"] += time.perf_counter() - began
        return result

    def apply_round(self, updates) -> None:
        began = time.perf_counter()
        super().apply_round(updates)
        self.timings["apply"] += time.perf_counter() - began

    def fill_reply(self, message, started_from: int) -> None:
        began = time.perf_counter()
        super().fill_reply(message, started_from)
        self.timings["pack"] += time.perf_counter() - began

    def answer(self, destination: int, started_from: int) -> None:
        began, packed = time.perf_counter(), self.timings["pack"]
        super().answer(destination, started_from)
        self.timings["send"] += time.perf_counter() - began - (self.timings["pack"] - packed)


def build_model(parameters: int, layers: int) -> nn.Sequential:
    """`layers` Linear(width, width) layers with width chosen so the total is close to `parameters`."""
    width = max(1, round((math.sqrt(1 + 4 * parameters / layers) - 1) / 2))
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def train(algorithm: Downpour, updates: int, gradients: list[list[torch.Tensor]]) -> None:
    """A trainer's loop with synthetic gradients: every step is one exchange with the server."""
    parameters = algorithm.parameters
    for step in range(updates):
        for parameter, gradient in zip(parameters, gradients[step % len(gradients)]):
            parameter.grad = gradient
        algorithm.after_backward(BATCH)
        algorithm.step(algorithm.optimizer)
        algorithm.after_step(step + 1)


def process(rank: int, world_size: int, port: int, folder: str, parameters: int, layers: int, updates: int,
            warmup: int, optimizer_name: str, timeout: float) -> None:
    """One rank: set up Downpour, run a warm-up round then a measured one, write what it saw."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout))
    try:
        torch.manual_seed(0)
        model = build_model(parameters, layers)
        if optimizer_name == "adam":
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        else:
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
        algorithm = TimedDownpour(DownpourOptions(sync_every=1))
        comm = Communicator(rank, world_size)
        algorithm.setup(model, optimizer, comm)
        generator = torch.Generator().manual_seed(rank)
        gradients = [] if rank == 0 else [
            [torch.randn(p.shape, generator=generator) for p in algorithm.parameters] for _ in range(2)]
        result = {}
        for count in (warmup, updates):
            algorithm.plan(count)
            algorithm.reset_timers()
            comm.seconds = 0.0
            comm.barrier()
            began = time.perf_counter()
            if rank == 0:
                algorithm.serve_epoch(0)
            else:
                train(algorithm, count, gradients)
            seconds = time.perf_counter() - began
            comm.barrier()
            staleness = algorithm.epoch_report().get("staleness")  # also clears the round's record
            result = {"seconds": seconds, "communication": comm.seconds, "timings": algorithm.timings,
                      "version": algorithm.version, "update_bytes": algorithm.update.buffer.numel() * 4,
                      "reply_bytes": algorithm.reply.buffer.numel() * 4,
                      "parameters": sum(p.numel() for p in algorithm.parameters), "staleness": staleness}
        (Path(folder) / f"rank-{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def measure(parameters: int, layers: int, trainers: int, updates: int, warmup: int, optimizer: str,
            timeout: float) -> list[dict]:
    """Each rank's measurements for one model size; every process is killed if they overrun `timeout`."""
    world_size = trainers + 1
    with tempfile.TemporaryDirectory() as folder:
        context = multiprocessing.start_processes(
            process, args=(world_size, free_port(), folder, parameters, layers, updates, warmup, optimizer, timeout),
            nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{parameters:,} parameters: processes did not finish within {timeout} s")
        finally:
            for child in context.processes:
                if child.is_alive():
                    child.kill()
                child.join()
        return [json.loads((Path(folder) / f"rank-{rank}.json").read_text()) for rank in range(world_size)]


def default_updates(parameters: int) -> int:
    """Updates per trainer: about 1 GB of gradients each, between 20 and 1000 updates."""
    return max(20, min(1000, 10**9 // (4 * parameters)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1e4,1e5,1e6,1e7", help="target parameter counts, comma-separated")
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--updates", type=int, help="updates per trainer (default: 1 GB of gradients, 20 to 1000)")
    parser.add_argument("--layers", type=int, default=4, help="equal Linear layers in the model")
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd", help="the server's (sgd: momentum 0.9)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one size may take")
    args = parser.parse_args(argv)
    sizes = [int(float(size)) for size in args.sizes.split(",")]

    info = machine()
    rows = []
    for size in sizes:
        updates = args.updates or default_updates(size)
        warmup = max(2, updates // 10)
        began = time.perf_counter()
        ranks = measure(size, args.layers, args.trainers, updates, warmup, args.optimizer, args.timeout)
        server, workers = ranks[0], ranks[1:]
        applied = updates * args.trainers
        seconds = server["seconds"]
        row = {
            "target": size, "parameters": server["parameters"], "updates": applied, "seconds": seconds,
            "updates_per_second": applied / seconds,
            "megabytes_per_second_in": applied * server["update_bytes"] / seconds / 1e6,
            "megabytes_per_second_out": applied * server["reply_bytes"] / seconds / 1e6,
            "message_megabytes": server["update_bytes"] / 1e6,
            "server_milliseconds": {part: 1000 * value / applied for part, value in server["timings"].items()},
            "trainer_milliseconds": 1000 * sum(w["seconds"] for w in workers) / len(workers) / updates,
            "trainer_communication_milliseconds": 1000 * sum(w["communication"] for w in workers) / len(workers)
            / updates,
            "staleness": server["staleness"], "wall_seconds": time.perf_counter() - began,
        }
        rows.append(row)
        print(f"{row['parameters']:>12,} parameters: {row['updates_per_second']:9.1f} updates/s, "
              f"{row['megabytes_per_second_in']:8.1f} MB/s in [{row['wall_seconds']:.0f} s]", flush=True)

    def line(row: dict) -> str:
        split = row["server_milliseconds"]
        return (f"| {row['parameters']:,} | {row['message_megabytes']:.2f} | {row['updates']} "
                f"| **{row['updates_per_second']:,.1f}** | {row['megabytes_per_second_in']:,.1f} "
                f"| {row['megabytes_per_second_out']:,.1f} | {split['receive']:.3f} | {split['apply']:.3f} "
                f"| {split['pack']:.3f} | {split['send']:.3f} | {row['trainer_milliseconds']:.3f} "
                f"| {row['staleness']['mean']:.2f} |")

    processes = args.trainers + 1
    warning = (f"\n**Warning:** {processes} processes on {info['cores']} cores: the server and its trainers share "
               "cores, so the server's receive time includes trainers waiting for a core.\n"
               if processes > info["cores"] else "")
    command = " ".join(["python -m benchmarks.server", *(sys.argv[1:] if argv is None else argv)])
    total = sum(r["wall_seconds"] for r in rows)
    table = "\n".join(line(r) for r in rows)
    markdown = f"""# server: Downpour server throughput against model size

Machine: {machine_line(info)}. Command: `{command}` ({total / 60:.1f} minutes).

{args.trainers} trainers and one server (rank 0), {processes} local processes joined by gloo over
TCP on 127.0.0.1, one thread each. The model is {args.layers} equal Linear layers sized to the target;
the server's optimizer is {args.optimizer}{" with momentum 0.9" if args.optimizer == "sgd" else ""}.
Trainers skip the forward pass: their gradients are random tensors drawn once, so the figures
are the protocol (one update message in, one reply of all weights out, each one flat float32
buffer) and the server's step. After a warm-up round (a tenth of the updates, at least 2), every
trainer sends the number of updates shown divided by {args.trainers}; the server's times are per
update applied. Receive includes waiting for any trainer to send; apply is the bookkeeping, the
gradients put in place and the optimizer's step; pack copies the weights into the reply; send
is the reply's transfer. Trainer ms is a trainer's wall time per exchange, its own work included.
{warning}
| parameters | MB per message | updates | updates / s | MB/s in | MB/s out | receive ms | apply ms | pack ms \
| send ms | trainer ms / update | mean staleness |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
{table}
"""
    path = write_result("server", markdown, {"machine": info, "arguments": vars(args), "rows": rows})
    print(markdown)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
