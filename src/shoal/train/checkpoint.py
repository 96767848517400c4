"""Checkpoints: a folder per epoch that lets a job continue exactly where it stopped.

`RUN_DIR/checkpoints/epoch-00003/` holds `rank-00000.pt` ... (each rank's model, optimizer,
algorithm and step count and its random-generator states) and `coordinator.pt` (the epoch, the
world size and what the coordinator needs to go on). The folder is assembled under a hidden
temporary name and renamed only when every file is in it, so a writer that dies leaves the
previous checkpoint valid. Every file and the folder are flushed to disk before the rename and
the parent folder after it; a folder of the same epoch already there is renamed aside and removed,
like the checkpoints past `keep`, only once the new one is on disk. Checkpoints are ordered by the
epoch number in their names, not by the names themselves. Each folder holds `manifest.json`, the
sha256 digest of each of its files (`manifest`): a file is read only once its bytes match it, and
then with `torch.load(weights_only=True)`.

On a cluster the run directory may be one folder shared by every machine or each machine's own:
each rank writes its file into the folder it sees. A marker file rank 0 leaves at the start
tells which ranks share its folder; the others are grouped by host. The first rank of each
group checks that every file of its group is there before renaming. Every file of one save carries
the same id (rank 0's temporary folder name), so a rank file left by an earlier save of the same
epoch (a machine that comes back) is never taken for this one's.

Resuming (`agree_on_latest`, collective) looks first at the newest checkpoint whose coordinator
file and rank-0 file rank 0 holds. When it was written by as many workers as the job has, the
resume is exact: the newest epoch every rank holds, among the checkpoints of this size newer than
any of another size (files a returning machine kept from before a change of size never count),
so the job ends bit for bit as an uninterrupted one. Otherwise, or when no such epoch is held by
every rank (a new machine), the checkpoint is resharded: only rank 0's files are read, and rank 0
hands its state to the others (see `reshard`). A rank file that does not match its digest or does
not load, or that its rank could not apply (`fits`: weights, optimizer state or random-generator
record that do not fit, or are not finite, see `state_checks`), is not held by that rank: it is
passed over, with a warning naming the file (relative to the run directory), for the previous
epoch, exact or resharded alike, and so is a rank's file of a save whose last resume failed before
its first step (`first_step`). A resume that finds checkpoints but none it can use is refused rather
than started again from epoch 0. A resume may change the number of workers
(`check_resumable` refuses every other key of the fingerprint that changes the course of training).

Nothing here writes through a symbolic link: the temporary folder has an unpredictable name and
is created exclusively, its files likewise, a `checkpoints` link is refused, and an `epoch-N`
link is neither read nor pruned (only ever unlinked). A full disk is one line naming the run
directory (`CheckpointFull`), not restarted; the temporary folder goes with the failed write.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import re
import uuid
import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from shoal.algorithms import options_class
from shoal.cluster.collectives import Communicator
from shoal.data import leftovers
from shoal.data.format import META_FILE, Dataset
from shoal.durable import disk_full, sync_folder
from shoal.errors import ConfigError, ShoalError
from shoal.safe_files import link_refused, make_folder, open_file, remove_tree
from shoal.train.first_step import Save, failed_saves
from shoal.train.manifest import Hashing, verify, write_manifest

CHECKPOINTS = "checkpoints"
COORDINATOR_FILE = "coordinator.pt"
SAVE_KEY = "save"  # in every file of a checkpoint: the id of the save that wrote it
FOLDER = re.compile(r"epoch-(\d+)")
ASIDE = re.compile(r"\.epoch-(\d+)\.old")  # a folder of the same epoch, renamed while its successor is written
Fits = Callable[[dict], str]
"""What a rank's state says of a loaded rank file: "" when it can take it, else why not (one line), before
anything of it is applied (`TrainingState.fits`)."""


class CheckpointFull(ShoalError):
    """The disk (or quota) filled up while a checkpoint was written: the user frees space, no restart helps."""


def folder_name(epoch: int) -> str:
    return f"epoch-{epoch:05d}"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def aside_name(epoch: int) -> str:
    return f".{folder_name(epoch)}.old"


def checkpoint_folders(run_dir: Path) -> list[tuple[int, Path]]:
    """(epoch, folder) of every checkpoint, newest first by number (epoch 100000 comes after 99999).

    A folder renamed aside while its epoch was written again stands for its epoch when the new
    one never arrived (the writer died between the two renames)."""
    folders: dict[int, Path] = {}
    aside: dict[int, Path] = {}
    for path in (Path(run_dir) / CHECKPOINTS).glob("*epoch-*"):
        if path.is_symlink():  # not shoal's: never read, never pruned
            continue
        if match := FOLDER.fullmatch(path.name):
            folders[int(match[1])] = path
        elif match := ASIDE.fullmatch(path.name):
            aside[int(match[1])] = path
    return sorted({**aside, **folders}.items(), reverse=True)


def _save(value: dict, path: Path) -> str:
    """Write one file of a checkpoint folder still under its temporary name, flushed to disk; a new file.
    Returns the digest of what was written (for the folder's manifest)."""
    with os.fdopen(open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as handle:
        hashing = Hashing(handle)
        torch.save(value, hashing)
        handle.flush()
        os.fsync(handle.fileno())
    return hashing.hexdigest()


def shown(path: Path) -> str:
    """A checkpoint's folder, or a file in it, as a warning names it: relative to the run directory."""
    path = Path(path)
    if FOLDER.fullmatch(path.name) or ASIDE.fullmatch(path.name):
        return f"{CHECKPOINTS}/{path.name}"
    return f"{CHECKPOINTS}/{path.parent.name}/{path.name}"


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
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / CHECKPOINTS
        self.comm, self.keep = comm, keep
        linked = comm.all_gather_object(self.root.is_symlink())  # every rank refuses together: none waits
        if any(linked):
            raise link_refused(self.root)
        shares = shares_folder(self.run_dir, comm)
        rank = comm.rank
        self.group = [other for other in range(comm.world_size)
                      if shares[other] == shares[rank] and (shares[rank] or hosts[other] == hosts[rank])]
        self.keeper = self.group[0] == rank  # assembles and renames its folder's checkpoint

    def save(self, epoch: int, rank_state: dict, coordinator_state: dict | None) -> Path:
        """Write checkpoint `epoch` (epochs completed); returns its final path."""
        temporary, save = self.begin(epoch)
        try:
            rank_state, written = {**rank_state, SAVE_KEY: save}, {}
            mine = temporary / rank_file(self.comm.rank)
            self.together(epoch, lambda: written.update(digest=_save(rank_state, mine)))
            digests = self.comm.all_gather_object(written["digest"])  # each keeper's manifest names its group's
            missing = [rank for rank in self.group
                       if not (temporary / rank_file(rank)).is_file()] if self.keeper else []
            problems = [problem for problem in self.comm.all_gather_object(missing) if problem]
            if problems:  # every rank raises together: none waits at the next barrier
                raise RuntimeError(f"{self.root}: checkpoint files of ranks {problems[0]} never appeared; "
                                   "a folder shared between machines that does not show every file")
            files = {rank_file(rank): digests[rank] for rank in self.group}
            self.together(epoch, lambda: self.finish(temporary, epoch, {**(coordinator_state or {}), SAVE_KEY: save},
                                                     files))
        except BaseException:
            if self.keeper:  # a failed write (a full disk) leaves no temporary folder behind
                remove_tree(temporary)
            raise
        return self.root / folder_name(epoch)

    def begin(self, epoch: int) -> tuple[Path, str]:
        """The temporary folder of `epoch` and the save's id: each keeper makes a folder (a new, unpredictable
        name) and its group learns the name; rank 0's names the save (collective)."""
        name = None
        if self.keeper:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            make_folder(self.root, exist_ok=True)
            leftovers.sweep(str(self.root), ".epoch-")  # left by writers that died
            remove_tree(self.root / f".{folder_name(epoch)}.tmp")  # the fixed name of earlier versions
            temporary = self.root / leftovers.owned_name(f".{folder_name(epoch)}")
            temporary.mkdir()
            name = temporary.name
        names = self.comm.all_gather_object(name)
        return self.root / names[self.group[0]], names[0]

    def together(self, epoch: int, action: Callable[[], object]) -> None:
        """Run `action` on every rank, then fail on every rank if it failed on any (collective): a full
        disk anywhere is one line, the same on every rank."""
        error = None
        try:
            action()
        except Exception as failure:  # handed on below, after the others know
            error = failure
        failures = self.comm.all_gather_object(None if error is None else (disk_full(error), str(error)))
        if any(failure and failure[0] for failure in failures):
            raise CheckpointFull(f"{self.run_dir}: the disk is full: checkpoint of epoch {epoch} not written "
                                 f"(free some space, then --resume {self.run_dir})") from None
        if error is not None:
            raise error
        failed = next((rank for rank, failure in enumerate(failures) if failure), None)
        if failed is not None:
            raise RuntimeError(f"{self.root}: rank {failed} could not write checkpoint {epoch}: {failures[failed][1]}")

    def finish(self, temporary: Path, epoch: int, coordinator_state: dict, files: dict[str, str]) -> None:
        """Rank 0's coordinator file, then each keeper writes its folder's manifest (`files`: its group's rank
        files and their digests), renames the folder into place and prunes."""
        if self.comm.rank == 0:
            coordinator = {**coordinator_state, "epoch": epoch, "world_size": self.comm.world_size}
            files = {**files, COORDINATOR_FILE: _save(coordinator, temporary / COORDINATOR_FILE)}
        if self.keeper:
            write_manifest(temporary, files, coordinator_state.get(SAVE_KEY))
            self.publish(temporary, epoch)
            self.prune()

    def publish(self, temporary: Path, epoch: int) -> None:
        """Rename a complete temporary folder into place, on disk before any older copy goes."""
        final, aside = self.root / folder_name(epoch), self.root / aside_name(epoch)
        sync_folder(temporary)  # each file was flushed by the rank that wrote it (_save)
        if final.is_symlink():  # not shoal's: the link goes, never what it points at
            final.unlink()
        if final.exists():  # the same epoch redone after a restart: kept aside until the new one is on disk
            remove_tree(aside)  # an earlier redo's leftover; `final` holds the epoch
            os.rename(final, aside)
        os.rename(temporary, final)
        sync_folder(self.root)
        remove_tree(aside)

    def prune(self) -> None:
        """Remove all but the `keep` newest checkpoints (call only once the newest is on disk)."""
        for epoch, _ in checkpoint_folders(self.run_dir)[self.keep:]:
            for name in (folder_name(epoch), aside_name(epoch)):
                remove_tree(self.root / name)


def shares_folder(run_dir: Path, comm: Communicator) -> list[bool]:
    """For each rank, whether it sees rank 0's run directory (a marker file rank 0 leaves for a moment)."""
    token = comm.broadcast_object(uuid.uuid4().hex if comm.rank == 0 else None)
    marker = run_dir / f".shoal-folder-{token}"
    if comm.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        os.close(open_file(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
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
    save: str | None = None
    """The id of the save that wrote it (None in checkpoints written before saves had one)."""
    reshard: bool = False
    """Resumed by resharding: every rank takes rank 0's state, the only file read (see `reshard`)."""

    @property
    def world_size(self) -> int | None:
        """How many workers wrote it."""
        return self.coordinator.get("world_size")

    def plain(self) -> dict:
        """As plain data, to send to the other ranks (`from_plain` reads it back)."""
        return {**dataclasses.asdict(self), "path": str(self.path)}

    @classmethod
    def from_plain(cls, plain: dict | None) -> Found | None:
        return None if plain is None else cls(**{**plain, "path": Path(plain["path"])})


def _load(path: Path) -> tuple[dict | None, str]:
    """(the file's content, "") or (None, why it does not load): its bytes are checked against the folder's
    manifest before torch reads them."""
    try:
        problem = verify(path)
        if problem:
            return None, f"{shown(path)}: {problem}"
        return torch.load(path, map_location="cpu", weights_only=True), ""
    except OSError as error:  # a missing or unreadable file: its name, not the whole path again
        return None, f"{shown(path)}: {type(error).__name__}: {error.strerror or error}"
    except Exception as error:  # a truncated or damaged file raises several kinds
        return None, f"{shown(path)}: {type(error).__name__}: {error}"


def _found(path: Path) -> tuple[Found | None, str]:
    """The checkpoint in folder `path` as its coordinator file tells it, or (None, why that does not load)."""
    coordinator, problem = _load(path / COORDINATOR_FILE)
    if coordinator is None:
        return None, problem
    epoch = coordinator.get("epoch") if isinstance(coordinator, dict) else None
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        return None, f"{shown(path / COORDINATOR_FILE)}: not a coordinator's record (no epoch number)"
    save = coordinator.pop(SAVE_KEY, None)
    return Found(path, epoch, coordinator, save), ""


def held_saves(run_dir: Path, rank: int, fits: Fits | None = None) -> dict[int, str | None]:
    """Epoch -> save id of each checkpoint whose file of `rank` matches its digest and loads in this machine's run
    directory (and that `fits` says the rank can apply), newest first; each other one is a warning naming it.
    A file that is not there is no warning: checkpoints of fewer workers have none of this rank (a rank short
    of a file the others hold is named when a checkpoint is chosen)."""
    held = {}
    for epoch, path in checkpoint_folders(run_dir):
        if not (path / rank_file(rank)).exists():
            continue
        state, problem = _load(path / rank_file(rank))
        if state is not None and fits is not None and (unfit := fits(state)):
            problem = f"{shown(path / rank_file(rank))}: {unfit}"
        if problem:
            warnings.warn(f"skipping damaged checkpoint {problem}", stacklevel=2)
        else:
            held[epoch] = state.get(SAVE_KEY) if isinstance(state, dict) else None
    return held


def untried(run_dir: Path, rank: int, held: dict[int, str | None], failed: Collection[Save]) -> dict[int, str | None]:
    """`held` (a rank's `held_saves`) but the saves whose last resume failed before its first step, each passed
    over with a warning naming the rank's file; all of them when none would be left (the newest is tried again
    rather than none)."""
    kept = {epoch: save for epoch, save in held.items() if (epoch, save) not in failed}
    passed = [epoch for epoch in held if epoch not in kept]
    folder = Path(run_dir) / CHECKPOINTS
    if passed and not kept:
        warnings.warn(f"every checkpoint of rank {rank} failed before its first step when last resumed; trying "
                      f"{shown(folder / folder_name(passed[0]) / rank_file(rank))} again", stacklevel=2)
        return held
    for epoch in passed:
        warnings.warn(f"skipping checkpoint {shown(folder / folder_name(epoch) / rank_file(rank))}: the last "
                      "resume from it failed before its first step", stacklevel=2)
    return kept


def held_epochs(run_dir: Path, rank: int, fits: Fits | None = None) -> list[int]:
    """The epochs whose checkpoint file of `rank` loads in this machine's run directory (and fits the model)."""
    return list(held_saves(run_dir, rank, fits))


def find_latest(run_dir: Path, world_size: int, epochs: set[int] | None = None) -> Found | None:
    """The newest checkpoint of `world_size` workers whose coordinator file loads, among `epochs` when given,
    else among those whose every rank file loads here (a folder all ranks share)."""
    for _, path in checkpoint_folders(run_dir):
        found, problem = _found(path)
        if found is not None and found.world_size != world_size:
            found, problem = None, f"{shown(path)}: written by {found.world_size} workers, this job has {world_size}"
        if found is not None and epochs is None:
            problem = next(filter(None, (_load(path / rank_file(rank))[1] for rank in range(world_size))), "")
        if found is not None and not problem and (epochs is None or found.epoch in epochs):
            return found
        if problem:
            warnings.warn(f"skipping damaged checkpoint {problem}", stacklevel=2)
    return None


def agree_on_latest(run_dir: Path, comm: Communicator, coordinator: bool, fits: Fits | None = None,
                    failed: Collection[Save] = ()) -> Found | None:
    """The checkpoint to resume from, the same on every rank (collective; `choose` tells which); `fits`
    passes over the files this rank cannot apply, `failed` this rank's files of the saves whose last resume
    failed before its first step (`first_step`).

    None when no rank has a checkpoint (a job that failed before its first); checkpoints none of
    which can be used are refused on every rank: starting again from epoch 0 would replace model.pt."""
    mine = untried(run_dir, comm.rank, held_saves(run_dir, comm.rank, fits), failed)
    held = comm.all_gather_object((mine, bool(checkpoint_folders(run_dir))))
    chosen = choose(run_dir, comm.world_size, [saves for saves, _ in held]) if coordinator else None
    found = Found.from_plain(comm.broadcast_object(None if chosen is None else chosen.plain()))
    if found is None and any(seen for _, seen in held):
        raise ConfigError(f"{run_dir}: no checkpoint can be resumed (each is damaged or does not fit the job, "
                          "see the warnings); "
                          "resuming would start again from epoch 0 and replace its model.pt: to start over, "
                          "train into a new --run-dir")
    return found


def choose(run_dir: Path, world_size: int, held: list[dict[int, str | None]]) -> Found | None:
    """Rank 0's choice, from its run directory and every rank's `held_saves`: the newest checkpoint whose
    coordinator and rank-0 files rank 0 holds; exactly when it was written by `world_size` workers and some
    epoch of this size, newer than any of another size, is held by every rank (the newest such), else
    resharded (None when rank 0 holds none)."""
    written = []
    for _, path in checkpoint_folders(run_dir):
        found, problem = _found(path)
        if found is None:
            warnings.warn(f"skipping damaged checkpoint {problem}", stacklevel=2)
        else:
            written.append(found)
    usable = next((index for index, found in enumerate(written) if _holds(held[0], found)), None)
    if usable is None:
        return None
    newest = written[usable]
    if newest.world_size == world_size:
        same = itertools.takewhile(lambda found: found.world_size == world_size, written[usable:])
        exact = next((found for found in same if all(_holds(saves, found) for saves in held)), None)
        short = [rank for rank, saves in enumerate(held) if not _holds(saves, newest)]
        if exact is not None:
            if exact.epoch < newest.epoch:
                warnings.warn(f"{run_dir}: ranks {short} hold no good file of epoch {newest.epoch}; going back to "
                              f"epoch {exact.epoch}, the newest every rank holds", stacklevel=2)
            return exact
        warnings.warn(f"{run_dir}: ranks {short} hold no good file of epoch {newest.epoch}: every rank takes "
                      "rank 0's state of it", stacklevel=2)
    return dataclasses.replace(newest, reshard=True)


def _holds(saves: dict[int, str | None], found: Found) -> bool:
    """Whether a rank's held saves hold its file of checkpoint `found` (of that save, where both tell theirs)."""
    if found.epoch not in saves:
        return False
    return saves[found.epoch] is None or found.save is None or saves[found.epoch] == found.save


def newest_epoch(run_dir: Path) -> int:
    """The epoch of the newest checkpoint with a good coordinator file (0 with none), but those whose last
    resume failed before its first step by the notes here (`first_step`) while an older one is left: where a
    restart begins, as the first machine sees it."""
    failed = failed_saves(Path(run_dir) / CHECKPOINTS)
    readable = [found for found, _ in (_found(path) for _, path in checkpoint_folders(run_dir)) if found is not None]
    untried = [found for found in readable if (found.epoch, found.save) not in failed]
    return (untried or readable)[0].epoch if readable else 0


# Job keys a resume may change, and why that leaves the weights as an uninterrupted job with the
# new values would have them; `fingerprint` holds every other key.
UNCHECKED = {
    "name": "a label",
    "data.test": "measured after training, never trained on",
    "data.cache_dir": "where the same rows are kept on local disk",
    "train.epochs": "more epochs is what resuming is for",
    "train.optimizer": "its settings besides the name are applied to the restored optimizer (TrainingState)",
    "train.eval_every": "when the test set is measured: evaluation draws no random numbers and changes no weight",
    "train.validate_every": "as train.eval_every",
    "train.validate_seconds": "as train.eval_every",
    "train.stop": "when the job ends: judged after an epoch is trained, it changes no weight of the epochs it lets run",
    "train.metrics": "as train.eval_every: measured on the test set, never trained on",
    "cluster.threads": "the machine's cores: the same sums, rounded as that machine rounds them",
    "cluster.device": "the machine's hardware: the same sums, rounded as that hardware rounds them",
    "cluster.timeout": "how long a collective may wait",
    "cluster.stall_timeout": "how long a silent worker is waited for",
    "cluster.hosts": "where the workers run; their count is cluster.workers",
    "cluster.nodes": "how many machines may run the workers; their count is cluster.workers",
    "cluster.rejoin_timeout": "how long a lost machine is waited for",
    "cluster.remote": "how the workers are started",
    "cluster.port": "where the workers meet",
    "cluster.memory_per_worker": "how many workers fit a machine; their count is cluster.workers",
    "output.run_dir": "the run directory resumed is the one holding the checkpoints",
    "output.progress": "what is shown",
    "output.loggers": "where the records are also written",
    "output.mlflow_uri": "as output.loggers",
    "output.mlflow_experiment": "as output.loggers",
    "checkpoint.every": "when checkpoints are written: writing one draws no random numbers",
    "checkpoint.keep": "how many checkpoints stay on disk",
    "checkpoint.allow_nonfinite": "whether non-finite weights are written and resumed from: finite ones are the same",
}


def dataset_identity(dataset: Dataset) -> str:
    """The training data as a resume tells it apart: the digest of its description (meta.json)."""
    return dataset.description_digest().hexdigest()


# Fingerprint keys a resume may change all the same: what they change is taken up as it says.
RESHARDED = {
    "cluster.workers": "rank 0's state is handed to every worker of the new count (see reshard)",
}


def fingerprint(job, spec: dict, train_set: Dataset, world_size: int) -> dict:
    """What a resumed job must share with the one that wrote the checkpoints, by job key: every key
    that changes the weights it ends with (the others are in UNCHECKED); those in RESHARDED are
    recorded, not refused."""
    return {
        "cluster.workers": world_size,
        "cluster.groups": job.cluster.groups,
        "cluster.balance": job.cluster.balance,  # the checkpoint's shares mean nothing to another balance
        "algorithm": {"name": job.algorithm.name, **job.algorithm.options},
        "model": spec,
        "train.optimizer.name": job.train.optimizer["name"],  # its state does not carry over to another
        # its state is kept by group: other patterns would put it on other parameters (their rates may change)
        "train.optimizer.param_groups": [group.get("params") if isinstance(group, dict) else group
                                         for group in job.train.optimizer.get("param_groups") or []],
        "train.step": job.train.step,
        "data.transform": job.data.transform,
        "train.validation_split": job.train.validation_split,  # which rows are trained on
        "train.batch_size": job.train.batch_size,
        "train.seed": job.train.seed,
        "train.shuffle": job.train.shuffle,
        "train.loss": job.train.loss,
        "train.scheduler": job.train.scheduler,  # its state does not carry over to another
        "train.clip_norm": job.train.clip_norm,
        "train.accumulate": job.train.accumulate,
        "train.precision": job.train.precision,
        "data.train": train_set.rows,
        "data.train.meta": dataset_identity(train_set),
        "data.memory_per_worker": job.data.memory_budget,  # a share in sub-partitions is visited in another order
    }


def check_resumable(run_dir: Path, job, spec: dict, train_set: Dataset, world_size: int) -> None:
    """Refuse to resume a job that differs from the checkpoints' in what would change its course; another
    `world_size` is resumed (resharded), not refused.

    Only the keys both fingerprints hold are compared: checkpoints written before a key was added
    still resume."""
    wanted = fingerprint(job, spec, train_set, world_size)
    for _, path in checkpoint_folders(run_dir):
        written, _ = _load(path / COORDINATOR_FILE)
        if written is None:  # damaged: choosing a checkpoint skips it with a warning
            continue
        recorded = written.get("fingerprint", {})
        changed = next((key for key in recorded if key in wanted and key not in RESHARDED
                        and _differs(key, recorded[key], wanted[key])), None)
        if changed is not None:
            raise _refusal(changed, recorded[changed], wanted[changed], path)
        return


def _differs(key: str, old, new) -> bool:
    """Whether a fingerprint's value changed. An option of the same algorithm that the checkpoints do not name
    (added to shoal since they were written, or left out as None) counts as its default, what they ran with."""
    if key != "algorithm" or not isinstance(old, dict) or old.get("name") != new.get("name"):
        return old != new
    defaults = {field.name: field.default for field in dataclasses.fields(options_class(new["name"]))}
    return any(old.get(option, defaults.get(option)) != new.get(option, defaults.get(option))
               for option in old.keys() | new.keys())


def _refusal(key: str, old, new, path: Path) -> ConfigError:
    """The one line that names the key that changed, its value in the checkpoints and now."""
    if key == "data.train.meta":  # the dataset's identity, told by its meta.json
        key, what, old, new = "data.train", "dataset", f"{META_FILE} sha256 {old[:12]}", new[:12]
    else:
        what, old, new = "rows" if key == "data.train" else "value", repr(old), repr(new)
    return ConfigError(f"{key}: the checkpoints in {path.parent} were written with another {what} "
                       f"({old}, now {new}); resume with the same one")


def coordinator_state(test: dict, fingerprint: dict) -> dict:
    """What the coordinator adds to a checkpoint: the latest test metrics and the job's fingerprint."""
    return {"test": test, "fingerprint": fingerprint}


def latest_test(found: Found) -> dict:
    """The test metrics recorded with a checkpoint ({} when none)."""
    return found.coordinator.get("test", {})


def load_rank(path: Path, rank: int, fits: Fits | None = None) -> dict:
    """The state in the file of `rank` of the checkpoint in `path` (as `save` was given it), its bytes checked
    against the folder's manifest and, with `fits`, its content, before anything of it is used. A file that
    fails (changed since the checkpoint was chosen) is a RuntimeError naming it: a restart passes over it."""
    file = Path(path) / rank_file(rank)
    state, problem = _load(file)
    if state is not None and not isinstance(state, dict):
        problem = f"{shown(file)}: not a rank's state"
    elif state is not None and fits is not None and (unfit := fits(state)):
        problem = f"{shown(file)}: {unfit}"
    if problem:
        raise RuntimeError(f"damaged checkpoint {problem}")
    state.pop(SAVE_KEY, None)
    return state
