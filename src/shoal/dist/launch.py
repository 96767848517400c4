"""Starting workers: N local processes through torch's elastic launcher, or one node of many.

Launching is apart from training: this module starts `python -m shoal.worker` processes and
turns their failures into one message naming the rank and host; it knows nothing about
models or data. A single machine uses a c10d rendezvous on 127.0.0.1 with a free port; a
cluster passes torchrun's node arguments through.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from shoal.errors import EXIT_USAGE, WorkerError


@dataclass
class Nodes:
    """Where this node stands in a multi-machine job (torchrun's arguments)."""

    count: int = 1
    rank: int | None = None
    endpoint: str | None = None
    run_id: str | None = None
    backend: str | None = None

    def rendezvous(self) -> tuple[str, str, dict]:
        """(backend, endpoint, configs) for the elastic launcher."""
        if self.count == 1 and self.endpoint is None:
            return "c10d", "127.0.0.1:0", {}
        if self.endpoint is None:
            raise WorkerError("--rdzv-endpoint HOST:PORT is required when --nnodes > 1")
        backend = self.backend or ("static" if self.rank is not None else "c10d")
        configs = {"rank": self.rank} if backend == "static" else {}
        return backend, self.endpoint, configs


def launch(job_file: Path, run_dir: Path, *, workers: int, threads: int, nodes: Nodes | None = None,
           max_restarts: int = 0) -> None:
    """Run `workers` local worker processes of the job to completion; raise WorkerError on failure."""
    nodes = nodes or Nodes()
    backend, endpoint, configs = nodes.rendezvous()
    os.environ["OMP_NUM_THREADS"] = str(threads)
    config = LaunchConfig(
        min_nodes=nodes.count,
        max_nodes=nodes.count,
        nproc_per_node=workers,
        # all nodes of a job must name the same run; a lone machine gets a fresh one
        run_id=nodes.run_id or ("shoal" if nodes.count > 1 else f"shoal-{uuid.uuid4().hex[:12]}"),
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=configs,
        max_restarts=max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
        local_addr="127.0.0.1" if nodes.count == 1 else None,
    )
    arguments = ["-u", "-m", "shoal.worker", str(job_file), "--run-dir", str(run_dir), "--threads", str(threads)]
    quiet = logging.getLogger("torch.distributed.elastic")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL if not os.environ.get("SHOAL_DEBUG_LAUNCH") else logging.INFO)  # shoal reports failures itself, in one line
    try:
        elastic_launch(config, sys.executable)(*arguments)
    except ChildFailedError as error:
        raise describe_failure(error) from None
    finally:
        quiet.setLevel(level)


def describe_failure(error: ChildFailedError) -> WorkerError:
    """The root cause among failed workers: prefer one that raised over ones that were killed."""
    failures = sorted(error.failures.items(), key=lambda item: item[1].timestamp)
    raised = [(rank, failure) for rank, failure in failures if failure.error_file_data]
    rank, failure = (raised or failures)[0]
    message = failure.message
    if isinstance(message, dict):  # the error file's {"message": ..., "extraInfo": {traceback}}
        message = message.get("message", "")
    message = str(message).strip().splitlines()[0] if message else f"exit status {failure.exitcode}"
    worker_error = WorkerError(f"worker rank {rank} on {socket.gethostname()} failed: {message}")
    worker_error.exit_code = EXIT_USAGE if failure.exitcode == EXIT_USAGE else 1
    return worker_error
