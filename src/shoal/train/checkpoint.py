"""Checkpoints: a folder per epoch that lets a job continue exactly where it stopped.

`RUN_DIR/checkpoints/epoch-00003/` holds `rank-00000.pt` ... (each rank's model, optimizer,
algorithm and step count and its random-generator states) and `coordinator.pt` (the epoch, the
world size and what the coordinator needs to go on). The folder is assembled under a hidden
temporary name and renamed only when every file is in it, so a writer that dies leaves the
previous checkpoint valid. All files are read with `torch.load(weights_only=True)`.

Every rank writes its own file, so the checkpoints folder must be one folder shared by all
nodes of a multi-machine job (the usual network file system) for them to be complete.
"""

from __future__ import annotations

import os
import random
import shutil
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
    """Writes this job's checkpoints; every rank calls `save` together (it has barriers)."""

    def __init__(self, run_dir: Path, comm: Communicator, keep: int):
        self.root = Path(run_dir) / CHECKPOINTS
        self.comm, self.keep = comm, keep

    def save(self, epoch: int, rank_state: dict, coordinator_state: dict | None) -> Path:
        """Write checkpoint `epoch` (epochs completed); returns its final path."""
        final = self.root / folder_name(epoch)
        temporary = self.root / f".{folder_name(epoch)}.tmp"
        if self.comm.rank == 0:
            shutil.rmtree(temporary, ignore_errors=True)  # left by a writer that died
            temporary.mkdir(parents=True)
        self.comm.barrier()
        temporary.mkdir(parents=True, exist_ok=True)  # a node without the shared folder
        _save(rank_state, temporary / rank_file(self.comm.rank))
        self.comm.barrier()
        if self.comm.rank == 0:
            _save({**(coordinator_state or {}), "epoch": epoch, "world_size": self.comm.world_size},
                  temporary / COORDINATOR_FILE)
            if final.exists():  # the same epoch redone after a restart
                shutil.rmtree(final)
            os.rename(temporary, final)
            self.prune()
        self.comm.barrier()
        return final

    def prune(self) -> None:
        for old in sorted(self.root.glob("epoch-*"))[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)


@dataclass
class Found:
    """A valid checkpoint and what its coordinator file says."""

    path: Path
    epoch: int
    coordinator: dict


def _valid(path: Path, world_size: int) -> tuple[dict | None, str]:
    try:
        coordinator = torch.load(path / COORDINATOR_FILE, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated or missing file raises several kinds
        return None, f"{path / COORDINATOR_FILE}: {type(error).__name__}: {error}"
    if coordinator.get("world_size") != world_size:
        return None, f"{path}: written by {coordinator.get('world_size')} workers, this job has {world_size}"
    for rank in range(world_size):
        try:
            torch.load(path / rank_file(rank), map_location="cpu", weights_only=True)
        except Exception as error:
            return None, f"{path / rank_file(rank)}: {type(error).__name__}: {error}"
    return coordinator, ""


def find_latest(run_dir: Path, world_size: int) -> Found | None:
    """The newest checkpoint whose files all load; damaged ones are skipped with a warning."""
    root = Path(run_dir) / CHECKPOINTS
    for path in sorted(root.glob("epoch-*"), reverse=True):
        coordinator, problem = _valid(path, world_size)
        if coordinator is not None:
            return Found(path, int(coordinator["epoch"]), coordinator)
        warnings.warn(f"skipping damaged checkpoint {problem}", stacklevel=2)
    return None


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
        try:
            written = torch.load(path / COORDINATOR_FILE, map_location="cpu", weights_only=True)
        except Exception:  # damaged: find_latest skips it with a warning
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
