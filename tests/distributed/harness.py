"""Run a function in N local processes joined by a gloo process group, with a hard timeout.

The processes fork from one server that imported torch once for the whole session (multiprocessing's
forkserver): spawning each afresh re-imported torch, some 2-3 s of a core per rank on a 2-core machine.
The server itself is single-threaded and has not touched a device, so forking from it is safe. Each rank
takes the caller's environment as it is at the call, as a spawned one would (the server's is that of the
first call); numpy's global random state is the server's in every rank, so tests seed their own.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shoal.process import end_process


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, folder: str, function, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=30))
    try:
        result = function(rank, world_size, *args)
        torch.save(result, Path(folder) / f"result-{rank}.pt")
    finally:
        dist.destroy_process_group()
    # as shoal's workers do: a thread gloo left can abort the interpreter's teardown after the work is saved
    end_process(0)


PRELOADED = ["torch", "torch.distributed", "shoal.algorithms"]


def _in_environment(rank: int, environment: dict, entry, *arguments) -> None:
    os.environ.clear()
    os.environ.update(environment)
    entry(rank, *arguments)


def run_processes(function, world_size: int, *args, timeout: float = 90.0, entry=_entry) -> list:
    """Each rank's return value of `function(rank, world_size, *args)`; kills all on timeout.
    `entry` joins the process group and saves the result (`_entry`'s arguments; by default gloo)."""
    mp.set_forkserver_preload(PRELOADED)
    with tempfile.TemporaryDirectory() as folder:
        arguments = (dict(os.environ), entry, world_size, free_port(), folder, function, args)
        context = mp.start_processes(_in_environment, args=arguments,
                                     nprocs=world_size, join=False, start_method="forkserver")
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"processes did not finish within {timeout} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()
        return [torch.load(Path(folder) / f"result-{rank}.pt", weights_only=False) for rank in range(world_size)]
