"""torch's elastic agent as shoal's launcher needs it: the one module that touches the agent's private members.

shoal's rendezvous restarts every node together and asks no shared store as a job ends, and a failed
worker's peers get shoal's short grace time, not torch's 30 s: three overrides of members torch does not
promise to keep (`_exit_barrier`, `_start_workers`, and `close` on the `_pcontext` it sets). Machines may
run different numbers of workers: a fourth (`_assign_worker_ranks`) numbers them from every node's count,
which shoal's rendezvous read once all had joined, where torch would multiply its node rank by its own count
or ask a shared store. tests/unit/cluster/test_agent_shim.py fails as soon as a torch release renames them
or changes their parameters, so an upgrade shows here and nowhere else.
"""

from __future__ import annotations

import logging

from torch.distributed.elastic.agent.server.api import Worker
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

SHUTDOWN_SECONDS = 5  # after SIGTERM, how long workers get before SIGKILL


class QuietDeathSignal(logging.Filter):
    """torch's agent logs "Received SIGTERM death signal, shutting down workers" when the launcher is stopped;
    shoal's launcher says in its own line why the machine stops (or leaves the job), so the agent's is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Received %s death signal")


logging.getLogger("torch.distributed.elastic.agent.server.api").addFilter(QuietDeathSignal())


def worker_ranks(counts: list[int], node_rank: int) -> range:
    """The global ranks of node `node_rank`'s workers: each machine's ranks are contiguous, in node order."""
    first = sum(counts[:node_rank])
    return range(first, first + counts[node_rank])


def node_of_rank(counts: list[int], rank: int) -> int:
    """The node whose workers include global rank `rank` (the last node for a rank past the end)."""
    for node in range(len(counts)):
        if rank in worker_ranks(counts, node):
            return node
    return len(counts) - 1


class NodeAgent(LocalElasticAgent):
    """torch's agent for this node's workers, minus what shoal's rendezvous does itself: no restarts of
    its own (every node restarts together), no exit barrier on the shared store, whose requests
    would block the launcher, unseen by signals, over a cut link, and ranks from every node's worker
    count (`counts`, by node rank; None: every node runs as many as this one)."""

    def __init__(self, *arguments, counts: list[int] | None = None, **options):
        super().__init__(*arguments, **options)
        self.counts = counts

    def _exit_barrier(self) -> None:
        pass

    def _assign_worker_ranks(self, store, group_rank: int, group_world_size: int, spec) -> list[Worker]:
        counts = self.counts or [spec.local_world_size] * group_world_size
        if len(counts) != group_world_size or counts[group_rank] != spec.local_world_size:
            raise RuntimeError(f"node {group_rank} of {group_world_size} runs {spec.local_world_size} workers, "
                               f"but the job's counts are {counts}")
        ranks, world_size = worker_ranks(counts, group_rank), sum(counts)
        return [Worker(local_rank=local, global_rank=rank, role_rank=rank, world_size=world_size,
                       role_world_size=world_size) for local, rank in enumerate(ranks)]

    def _start_workers(self, worker_group):
        started = super()._start_workers(worker_group)
        # once one worker fails torch stops the others with its default 30 s before SIGKILL, not the
        # agent's shutdown timeout: a stopped or wedged worker would hold every failure that long
        close = self._pcontext.close
        self._pcontext.close = lambda death_sig=None, timeout=SHUTDOWN_SECONDS: close(death_sig,
                                                                                     min(timeout, SHUTDOWN_SECONDS))
        return started
