"""`--workers auto`: as many workers as this machine has cores for and memory to hold (cNeural's k).

k = min(cores / threads per worker, what fits in the memory available now), at least 1, decided
on each machine for itself (machines may run different counts; each takes its share of the data
to be 1/nodes, as if the others ran as many as it does). A worker's memory is
`cluster.memory_per_worker` when given; else torch's own footprint in a worker process plus its
share of the training set as it sits in memory (features in their stored dtype, as the loader
keeps them: uint8 images take a byte per feature, converted to float per batch; and labels; no
more than data.memory_per_worker, past which a worker trains from a disk cache in sub-partitions).
"""

from __future__ import annotations

import psutil

from shoal.cluster.env import cores
from shoal.config import JobConfig, parse_size
from shoal.data.format import open_dataset

WORKER_FOOTPRINT = 512 * 2**20
"""A worker before its data: the interpreter, torch and gloo (job_end's memory records say about 350 MiB)."""
LABEL_BYTES = 8


def auto_workers(job: JobConfig, nodes: int = 1, available: int | None = None, core_count: int | None = None
                 ) -> tuple[int, str]:
    """This machine's worker count for the job on `nodes` machines, and the reason in words (which says,
    across machines, that the others are taken to run as many)."""
    available = psutil.virtual_memory().available if available is None else available
    core_count = cores() if core_count is None else core_count
    by_cores = max(core_count // max(job.cluster.threads, 1), 1)
    node_share = share_bytes(job) / nodes
    for count in range(by_cores, 0, -1):
        needed = memory_needed(job, node_share, count)
        if needed <= available or count == 1:
            break
    limit = "cores" if count == by_cores else "memory"
    reason = (f"{count} worker(s): {core_count} cores, {available / 2**30:.1f} GiB available, "
              f"{needed / count / 2**30:.2f} GiB each ({limit} decide)")
    if nodes > 1:  # each machine answers for itself, not knowing what the others will run
        reason += f"; its share of the data assumes the other {nodes - 1} machine(s) run as many"
    return count, reason


def share_bytes(job: JobConfig) -> float:
    """The training set as the workers hold it in memory (features in their stored dtype, and labels);
    0 when the job states a worker's memory itself."""
    if job.cluster.memory_per_worker is not None:
        return 0.0
    train = open_dataset(job.data.train)
    return train.rows * (train.features * train.feature_dtype.itemsize + LABEL_BYTES)


def memory_needed(job: JobConfig, node_share: float, count: int) -> int:
    """Bytes `count` workers hold on a machine whose share of the training set is `node_share` bytes."""
    if job.cluster.memory_per_worker is not None:
        return count * parse_size("cluster.memory_per_worker", job.cluster.memory_per_worker)
    share = node_share / count  # each worker's rows in memory
    if job.data.memory_budget is not None:
        share = min(share, job.data.memory_budget)
    return int(count * (WORKER_FOOTPRINT + share))


def main(argv: list[str] | None = None) -> int:
    """`python -m shoal.train.capacity JOB --nodes N`: this machine's count and reason, tab-separated
    (what `shoal train --hosts ... --workers auto` asks each host)."""
    import argparse

    from shoal.jobs import load_job

    parser = argparse.ArgumentParser(prog="python -m shoal.train.capacity", description=main.__doc__)
    parser.add_argument("job")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    count, reason = auto_workers(load_job(args.job, args.overrides), args.nodes)
    print(f"{count}\t{reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
