"""torchrun: RANK, WORLD_SIZE, LOCAL_*, set by torch's elastic agent (shoal's own launcher runs one too:
shoal.cluster.environments.shoal_launcher tells the two apart)."""

from __future__ import annotations

from shoal.cluster.environments.base import Environment


class TorchElastic(Environment):
    name = "torchrun"
    RANK, SIZE, LOCAL_RANK, LOCAL_SIZE = "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"
    keeps_store_across_restarts = True  # torchrun's agents keep theirs, and their workers may share it

    def max_restarts(self) -> int:
        """torchrun's `--max-restarts`. (Its TORCHELASTIC_RESTART_COUNT counts one machine's agent's restarts
        after its own workers failed, not the job's: see shoal.cluster.env.agree_attempt.)"""
        return self.number("TORCHELASTIC_MAX_RESTARTS", 0)
