"""torchrun (and torch's elastic agent under shoal's own launcher): RANK, WORLD_SIZE, LOCAL_*."""

from __future__ import annotations

from shoal.cluster.environments.base import Environment


class TorchElastic(Environment):
    name = "torchrun"
    RANK, SIZE, LOCAL_RANK, LOCAL_SIZE = "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"

    def restart_count(self) -> int:
        """How many times torchrun's agent has restarted the workers (its `--max-restarts`)."""
        return self.number("TORCHELASTIC_RESTART_COUNT", 0)
