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
    """One launcher's variables; subclasses name them. What differs between launchers beyond numbering is
    stated here as capabilities, so no module asks which launcher it runs under; `shoal.cluster.environments
    .named(DistInfo.launcher)` gives the class of the one detected."""

    name = "?"
    RANK = SIZE = LOCAL_RANK = LOCAL_SIZE = ""
    records_failures = False
    """The launcher finds a failed attempt's root cause and records it; otherwise the workers record their own
    exits (shoal.train.exits)."""
    keeps_store_across_restarts = False
    """The launcher's store outlives a restart of the workers (torchrun's agents): they count the attempts in it
    and key each apart (shoal.cluster.env.agree_attempt). Otherwise each attempt meets at a fresh store."""
    checks_memory = False
    """The launcher checked that the model fits this machine's memory before any worker started."""
    holds_run_dir = False
    """The launcher holds the run directory's lock for the job; otherwise rank 0 does."""

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

    def launcher_pid(self) -> int | None:
        """The launcher whose end ends this process, where the launcher names it; None: the parent, whoever it
        is (shoal.cluster.orphan.end_with_parent)."""
        return None

    def worker_ends_with_server(self) -> bool:
        """Whether a worker that shoal's fork server forks in this process's place must end with the server
        (its parent, which ends with the launcher) rather than with the launcher named here."""
        return False

    def gpu_per_process(self) -> bool:
        """Whether the launcher shows each process only its own GPU (then it is cuda:0 to every one)."""
        return False
