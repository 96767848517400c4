"""Checkpoints: a folder per epoch that lets a job continue exactly where it stopped.

`RUN_DIR/checkpoints/epoch-00003/` holds `rank-00000.pt` ... (each rank's model, optimizer,
algorithm and step count and its random-generator states) and `coordinator.pt` (the epoch, the
world size and what the coordinator needs to go on). The folder is assembled under a hidden
temporary name and renamed only when every file is in it, so a writer that dies leaves the
previous checkpoint valid. All files are read with `torch.load(weights_only=True)`.

On a cluster the run directory may be one folder shared by every machine or each machine's own:
each rank writes its file into the folder it sees. A marker file rank 0 leaves at the start
tells which ranks share its folder; the others are grouped by host. The first rank of each
group checks that every file of its group is there before renaming. Resuming takes the newest
epoch every rank holds, agreed over the process group.
"""

from __future__ import annotations

import os
import random
import shutil
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from shoal.cluster.collectives import Communicator
from shoal.errors import ConfigError

CHECKPOINTS = "checkpoints"
COORDINATOR_FILE = "coordinator.pt"


def folder_name(epoch: int) -> str:
    return f"epoch-{epoch:05d}"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def _save(value: dict, path: Path) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    torch.save(value, temporary)
    os.replace(temporary, path)


def random_state(device: torch.device) -> dict:
    """Every generator a model or factory may draw from, as tensors and plain data (weights_only)."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": position,
                       "has_gauss": has_gauss, "cached": cached},
             "python": {"version": version, "internal": list(internal), "gauss": gauss}}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_random_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        numpy_state = state["numpy"]
        np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32),
                             numpy_state["position"], numpy_state["has_gauss"], numpy_state["cached"]))
    if "python" in state:
        python_state = state["python"]
        random.setstate((python_state["version"], tuple(python_state["internal"]), python_state["gauss"]))
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


class Checkpointer:
    """Writes this job's checkpoints; every rank calls `__init__` and `save` together (they are collective)."""

    def __init__(self, run_dir: Path, comm: Communicator, keep: int, hosts: list[str] | None = None):
        """`hosts`: each rank's host, to tell apart the folders of machines that share none (default: one)."""
        hosts = hosts or [""] * comm.world_size
        self.root = Path(run_dir) / CHECKPOINTS
        self.comm, self.keep = comm, keep
        shares = shares_folder(Path(run_dir), comm)
        rank = comm.rank
        self.group = [other for other in range(comm.world_size)
                      if shares[other] == shares[rank] and (shares[rank] or hosts[other] == hosts[rank])]
        self.keeper = self.group[0] == rank  # assembles and renames its folder's checkpoint

    def save(self, epoch: int, rank_state: dict, coordinator_state: dict | None) -> Path:
        """Write checkpoint `epoch` (epochs completed); returns its final path."""
        final = self.root / folder_name(epoch)
        temporary = self.root / f".{folder_name(epoch)}.tmp"
        if self.keeper:
            shutil.rmtree(temporary, ignore_errors=True)  # left by a writer that died
            temporary.mkdir(parents=True)
        self.comm.barrier()
        _save(rank_state, temporary / rank_file(self.comm.rank))
        self.comm.barrier()
        missing = [rank for rank in self.group if not (temporary / rank_file(rank)).is_file()] if self.keeper else []
        problems = [problem for problem in self.comm.all_gather_object(missing) if problem]
        if problems:  # every rank raises together: none waits at the next barrier
            raise RuntimeError(f"{temporary}: checkpoint files of ranks {problems[0]} never appeared; "
                               "a folder shared between machines that does not show every file")
        if self.comm.rank == 0:
            _save({**(coordinator_state or {}), "epoch": epoch, "world_size": self.comm.world_size},
                  temporary / COORDINATOR_FILE)
        if self.keeper:
            if final.exists():  # the same epoch redone after a restart
                shutil.rmtree(final)
            os.rename(temporary, final)
            self.prune()
        self.comm.barrier()
        return final

    def prune(self) -> None:
        for old in sorted(self.root.glob("epoch-*"))[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)


def shares_folder(run_dir: Path, comm: Communicator) -> list[bool]:
    """For each rank, whether it sees rank 0's run directory (a marker file rank 0 leaves for a moment)."""
    token = comm.broadcast_object(uuid.uuid4().hex if comm.rank == 0 else None)
    marker = run_dir / f".shoal-folder-{token}"
    if comm.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        marker.touch()
    comm.barrier()
    shares = comm.all_gather_object(marker.exists())
    comm.barrier()
    if comm.rank == 0:
        marker.unlink()
    return shares


@dataclass
class Found:
    """A valid checkpoint and what its coordinator file says."""

    path: Path
    epoch: int
    coordinator: dict


def _load(path: Path) -> tuple[dict | None, str]:
    """(the file's content, "") or (None, why it does not load)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True), ""
    except Exception as error:  # a truncated or missing file raises several kinds
        return None, f"{path}: {type(error).__name__}: {error}"


def _coordinator(path: Path, world_size: int) -> tuple[dict | None, str]:
    coordinator, problem = _load(path / COORDINATOR_FILE)
    if coordinator is None:
        return None, problem
    if coordinator.get("world_size") != world_size:
        return None, f"{path}: written by {coordinator.get('world_size')} workers, this job has {world_size}"
    return coordinator, ""


def held_epochs(run_dir: Path, rank: int) -> list[int]:
    """The epochs whose checkpoint file of `rank` loads in this machine's run directory."""
    held = []
    for path in sorted((Path(run_dir) / CHECKPOINTS).glob("epoch-*"), reverse=True):
        _, problem = _load(path / rank_file(rank))
        if problem:
            warnings.warn(f"skipping damaged checkpoint {problem}", stacklevel=2)
        else:
            held.append(int(path.name.split("-")[1]))
    return held


def find_latest(run_dir: Path, world_size: int, epochs: set[int] | None = None) -> Found | None:
    """The newest checkpoint whose coordinator file loads, among `epochs` when given (those every rank
    holds), else among those whose every rank file loads here (a folder all ranks share)."""
    root = Path(run_dir) / CHECKPOINTS
    for path in sorted(root.glob("epoch-*"), reverse=True):
        coordinator, problem = _coordinator(path, world_size)
        if coordinator is not None and epochs is None:
            problem = next(filter(None, (_load(path / rank_file(rank))[1] for rank in range(world_size))), "")
        if coordinator is not None and not problem and (epochs is None or int(coordinator["epoch"]) in epochs):
            return Found(path, int(coordinator["epoch"]), coordinator)
        if problem:
            warnings.warn(f"skipping damaged checkpoint {problem}", stacklevel=2)
    return None


def agree_on_latest(run_dir: Path, comm: Communicator, coordinator: bool) -> Found | None:
    """The newest checkpoint every rank holds a good file of, in whichever folder it sees (collective)."""
    held = comm.all_gather_object(held_epochs(run_dir, comm.rank))
    common = set.intersection(*(set(epochs) for epochs in held))
    if coordinator and held[0] and max(held[0]) > max(common, default=0):
        short = [rank for rank, epochs in enumerate(held) if max(held[0]) not in epochs]
        warnings.warn(f"{run_dir}: ranks {short} hold no good file of epoch {max(held[0])}; going back to epoch "
                      f"{max(common, default=0)}, the newest every rank holds", stacklevel=2)
    return comm.broadcast_object(find_latest(run_dir, comm.world_size, common) if coordinator else None)


def newest_epoch(run_dir: Path) -> int:
    """The epoch of the newest checkpoint with a good coordinator file (0 with none): where a restart
    begins, as the first machine sees it."""
    for path in sorted((Path(run_dir) / CHECKPOINTS).glob("epoch-*"), reverse=True):
        coordinator, _ = _load(path / COORDINATOR_FILE)
        if coordinator is not None:
            return int(coordinator["epoch"])
    return 0


def fingerprint(job, spec: dict, train_rows: int, world_size: int) -> dict:
    """What a resumed job must share with the one that wrote the checkpoints, by job key."""
    return {
        "cluster.workers": world_size,
        "algorithm": {"name": job.algorithm.name, **job.algorithm.options},
        "model": spec,
        "train.optimizer.name": job.train.optimizer["name"],
        "train.batch_size": job.train.batch_size,
        "train.seed": job.train.seed,
        "data.train": train_rows,
    }


def check_resumable(run_dir: Path, job, spec: dict, train_rows: int, world_size: int) -> None:
    """Refuse to resume a job that differs from the checkpoints' in what would change its course."""
    wanted = fingerprint(job, spec, train_rows, world_size)
    for path in sorted((Path(run_dir) / CHECKPOINTS).glob("epoch-*"), reverse=True):
        written, _ = _load(path / COORDINATOR_FILE)
        if written is None:  # damaged: find_latest skips it with a warning
            continue
        recorded = written.get("fingerprint", {"cluster.workers": written.get("world_size")})
        for key, value in recorded.items():
            if wanted.get(key) != value:
                if key == "cluster.workers":
                    raise ConfigError(f"{path}: written by {value} workers; resume with the same count "
                                      f"(--workers {value} per machine for a one-machine job), not {wanted[key]}")
                what = "rows" if key == "data.train" else "value"
                raise ConfigError(f"{key}: the checkpoints in {path.parent} were written with another {what} "
                                  f"({value!r}, now {wanted.get(key)!r}); resume with the same one")
        return


def coordinator_state(test: dict, fingerprint: dict) -> dict:
    """What the coordinator adds to a checkpoint: the latest test metrics and the job's fingerprint."""
    return {"test": test, "fingerprint": fingerprint}


def latest_test(found: Found) -> dict:
    """The test metrics recorded with a checkpoint ({} when none)."""
    return found.coordinator.get("test", {})


def load_rank(path: Path, rank: int) -> dict:
    return torch.load(Path(path) / rank_file(rank), map_location="cpu", weights_only=True)
