"""torch's elastic agent as shoal's launcher needs it: the one module that touches the agent's private members.

shoal's rendezvous restarts every node together and asks no shared store as a job ends, and a failed
worker's peers get shoal's short grace time, not torch's 30 s: three overrides of members torch does not
promise to keep (`_exit_barrier`, `_start_workers`, and `close` on the `_pcontext` it sets).
tests/unit/cluster/test_agent_shim.py fails as soon as a torch release renames them or changes their
parameters, so an upgrade shows here and nowhere else.
"""

from __future__ import annotations

from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

SHUTDOWN_SECONDS = 5  # after SIGTERM, how long workers get before SIGKILL


class NodeAgent(LocalElasticAgent):
    """torch's agent for this node's workers, minus what shoal's rendezvous does itself: no restarts of
    its own (every node restarts together) and no exit barrier on the shared store, whose requests
    would block the launcher, unseen by signals, over a cut link."""

    def _exit_barrier(self) -> None:
        pass

    def _start_workers(self, worker_group):
        started = super()._start_workers(worker_group)
        # once one worker fails torch stops the others with its default 30 s before SIGKILL, not the
        # agent's shutdown timeout: a stopped or wedged worker would hold every failure that long
        close = self._pcontext.close
        self._pcontext.close = lambda death_sig=None, timeout=SHUTDOWN_SECONDS: close(death_sig,
                                                                                     min(timeout, SHUTDOWN_SECONDS))
        return started
