"""What every launcher's environment answers, so the rest of shoal never reads launcher variables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shoal.errors import ShoalError


@dataclass(frozen=True)
class Place:
    """This process's place in the job, as its launcher numbered it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


class Environment:
    """One launcher's variables; subclasses name them."""

    name = "?"
    RANK = SIZE = LOCAL_RANK = LOCAL_SIZE = ""

    def __init__(self, environ: Mapping[str, str]):
        self.environ = environ

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return cls.RANK in environ and cls.SIZE in environ

    def number(self, name: str, default: int | None = None) -> int:
        value = self.environ.get(name)
        if value is None and default is not None:
            return default
        try:
            return int(str(value).split("(")[0])
        except ValueError:
            raise ShoalError(f"{name}: {self.name} set it to {value!r}, not a number") from None

    def place(self) -> Place:
        world_size = self.number(self.SIZE)
        return Place(rank=self.number(self.RANK), world_size=world_size, local_rank=self.number(self.LOCAL_RANK, 0),
                     local_world_size=self.number(self.LOCAL_SIZE, world_size))

    def master(self) -> tuple[str, int] | None:
        """(address, port) of rank 0's store when the launcher tells or implies it; None otherwise."""
        address, port = self.environ.get("MASTER_ADDR"), self.environ.get("MASTER_PORT")
        return (address, int(port)) if address and port else None

    def stop_grace(self) -> float:
        """Seconds between the launcher's SIGTERM and its SIGKILL (torchrun's and SLURM's KillWait: 30)."""
        return 30.0

    def max_restarts(self) -> int:
        """How many times the launcher itself restarts failed workers within the job (torchrun's agent does)."""
        return 0

    def requeue_count(self) -> int:
        """How many times the scheduler requeued the whole job (SLURM's --requeue): a fresh start that resumes."""
        return 0

    def gpu_per_process(self) -> bool:
        """Whether the launcher shows each process only its own GPU (then it is cuda:0 to every one)."""
        return False
