"""SLURM's srun: ranks from SLURM_PROCID and friends, and rank 0's address implied by the node list.

srun tells each task its rank and node but not where to meet, so the store's address is the
first host of the step's node list (expanded as `scontrol show hostnames` does) and its port is
derived from the job id, the same on every node. Tasks per node come in SLURM's compressed form
("4(x2),3": four tasks on each of two nodes, then three).
"""

from __future__ import annotations

import dataclasses
import itertools
import re

from shoal.cluster.environments.base import Environment, Place
from shoal.errors import ShoalError

PORT_BASE, PORT_SPAN = 20000, 20000  # the store's port: PORT_BASE + job id modulo PORT_SPAN


def expand_tasks(text: str) -> list[int]:
    """'4(x2),3' -> [4, 4, 3]."""
    counts = []
    for part in filter(None, text.split(",")):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ShoalError(f"tasks per node: cannot read {text!r} (SLURM's form is like 4(x2),3)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _split_outside_brackets(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for character in text:
        depth += {"[": 1, "]": -1}.get(character, 0)
        if character == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += character
    return [part for part in [*parts, current] if part]


def _expand_range(text: str) -> list[str]:
    """'01-03,7' -> ['01', '02', '03', '7'] (zero padding kept)."""
    values = []
    for item in text.split(","):
        start, _, end = item.partition("-")
        if not start.isdigit() or (end and not end.isdigit()):
            raise ShoalError(f"node list: cannot read the range [{text}]")
        values += [str(number).zfill(len(start)) for number in range(int(start), int(end or start) + 1)]
    return values


def expand_nodes(text: str) -> list[str]:
    """'node[01-03,07],gpu-[1-2]x[a]' as `scontrol show hostnames` expands it, in order."""
    hosts = []
    for item in _split_outside_brackets(text):
        pieces = re.split(r"\[([^\]]*)\]", item)  # text, range, text, range, ..., text
        choices = [[piece] if index % 2 == 0 else _expand_range(piece) for index, piece in enumerate(pieces)]
        hosts += ["".join(combination) for combination in itertools.product(*choices)]
    return hosts


class Slurm(Environment):
    name = "SLURM"
    RANK, SIZE, LOCAL_RANK = "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"

    def place(self) -> Place:
        place = super().place()
        return dataclasses.replace(place, local_world_size=self.local_world_size(place.world_size))

    def local_world_size(self, world_size: int) -> int:
        for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            if name in self.environ:
                counts = expand_tasks(self.environ[name])
                node = self.number("SLURM_NODEID", 0)
                return counts[node] if node < len(counts) else counts[-1]
        return self.number("SLURM_NTASKS_PER_NODE", world_size)

    def master(self) -> tuple[str, int] | None:
        given = super().master()
        if given is not None:
            return given
        nodes = self.environ.get("SLURM_STEP_NODELIST") or self.environ.get("SLURM_JOB_NODELIST") or \
            self.environ.get("SLURM_NODELIST")
        if not nodes or "SLURM_JOB_ID" not in self.environ:
            return None
        port = int(self.environ.get("MASTER_PORT") or PORT_BASE + self.number("SLURM_JOB_ID") % PORT_SPAN)
        return self.environ.get("MASTER_ADDR") or expand_nodes(nodes)[0], port

    def requeue_count(self) -> int:
        """SLURM_RESTART_COUNT: set in a job requeued after a preemption, a node failure or `scontrol requeue`."""
        return self.number("SLURM_RESTART_COUNT", 0)

    def gpu_per_process(self) -> bool:
        return self.environ.get("SLURM_GPUS_PER_TASK", "").strip() == "1"
