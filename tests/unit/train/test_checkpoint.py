"""Checkpoints without processes: a world of one, or two ranks on the fake communicator's threads."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import warnings

import numpy as np
import pytest
import torch

from shoal.cluster.collectives import Communicator
from shoal.cluster.fake import run_ranks
from shoal.data.format import DatasetWriter, open_dataset
from shoal.errors import ConfigError, ShoalError
from shoal.jobs import from_dict
from shoal.train.checkpoint import (
    CHECKPOINTS,
    COORDINATOR_FILE,
    Checkpointer,
    CheckpointFull,
    agree_on_latest,
    check_resumable,
    dataset_identity,
    find_latest,
    fingerprint,
    load_rank,
    random_state,
    restore_random_state,
)
from shoal.train.manifest import MANIFEST, file_digest
from shoal.train.state import model_misfit

CPU = torch.device("cpu")
SPEC = {"input": [4], "layers": [{"dense": 3}]}
ROWS = 1000


def rank_state(rank: int, epoch: int) -> dict:
    """A rank's state shaped as the runner writes it: model, optimizer state (as Adam's), counters.

    The optimizer state is built by hand: a first optimizer step costs torch over a second of imports.
    """
    generator = torch.Generator().manual_seed(10 * epoch + rank)
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    moments = {index: {"step": torch.tensor(float(epoch)), "exp_avg": torch.randn(p.shape, generator=generator),
                       "exp_avg_sq": torch.rand(p.shape, generator=generator)}
               for index, p in enumerate(model.parameters())}
    optimizer = {"state": moments, "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8,
                                                     "amsgrad": False, "params": [0, 1]}]}
    return {"model": model.state_dict(), "optimizer": optimizer, "global_step": 100 * epoch + rank}


def assert_same(loaded, saved) -> None:
    """Nested dicts, lists and tensors equal (tensors exactly)."""
    if isinstance(saved, torch.Tensor):
        assert isinstance(loaded, torch.Tensor) and torch.equal(loaded, saved)
    elif isinstance(saved, dict):
        assert loaded.keys() == saved.keys()
        for key in saved:
            assert_same(loaded[key], saved[key])
    elif isinstance(saved, (list, tuple)):
        assert len(loaded) == len(saved)
        for a, b in zip(loaded, saved):
            assert_same(a, b)
    else:
        assert loaded == saved


def save_alone(run_dir, epoch: int, keep: int = 10, coordinator: dict | None = None):
    return Checkpointer(run_dir, Communicator(0, 1), keep).save(epoch, rank_state(0, epoch), coordinator)


def epochs_on_disk(run_dir) -> list[str]:
    return sorted(path.name for path in (run_dir / CHECKPOINTS).iterdir())


def latest_quietly(run_dir, world_size: int = 1):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a valid newest checkpoint needs no warning
        return find_latest(run_dir, world_size)


# ---------------------------------------------------------------- save, find, load


def test_no_checkpoints_found_in_a_fresh_run(tmp_path):
    assert latest_quietly(tmp_path) is None


def test_save_then_find_latest_returns_the_newest_and_load_rank_what_was_saved(tmp_path):
    for epoch in (1, 2, 3):
        path = save_alone(tmp_path, epoch, coordinator={"test": {"loss": 1.0 / epoch}})
        assert path == tmp_path / CHECKPOINTS / f"epoch-{epoch:05d}"
    found = latest_quietly(tmp_path)
    assert (found.path, found.epoch) == (tmp_path / CHECKPOINTS / "epoch-00003", 3)
    assert found.coordinator == {"test": {"loss": 1.0 / 3}, "epoch": 3, "world_size": 1}
    assert sorted(p.name for p in found.path.iterdir()) == [COORDINATOR_FILE, MANIFEST, "rank-00000.pt"]
    assert_same(load_rank(found.path, 0), rank_state(0, 3))


def test_two_ranks_on_threads_write_one_checkpoint(tmp_path):
    def body(comm):
        checkpointer = Checkpointer(tmp_path, comm, keep=2)
        for epoch in (1, 2, 3):
            checkpointer.save(epoch, rank_state(comm.rank, epoch), {"by": "coordinator"} if comm.rank == 0 else None)
        return comm.rank

    assert run_ranks(2, body) == [0, 1]
    assert epochs_on_disk(tmp_path) == ["epoch-00002", "epoch-00003"]
    found = latest_quietly(tmp_path, world_size=2)
    assert found.epoch == 3 and found.coordinator == {"by": "coordinator", "epoch": 3, "world_size": 2}
    for rank in (0, 1):
        assert_same(load_rank(found.path, rank), rank_state(rank, 3))


def test_a_checkpoint_of_another_world_size_is_skipped_with_a_warning(tmp_path):
    save_alone(tmp_path, 1)
    with pytest.warns(UserWarning, match=r"epoch-00001: written by 1 workers, this job has 2"):
        assert find_latest(tmp_path, world_size=2) is None


@pytest.mark.parametrize("damaged", ["rank-00000.pt", COORDINATOR_FILE])
def test_a_truncated_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path, damaged):
    save_alone(tmp_path, 1)
    newest = save_alone(tmp_path, 2)
    content = (newest / damaged).read_bytes()
    (newest / damaged).write_bytes(content[: len(content) // 2])
    with pytest.warns(UserWarning, match=rf"skipping damaged checkpoint .*epoch-00002/{re.escape(damaged)}: "):
        found = find_latest(tmp_path, world_size=1)
    assert found.epoch == 1
    assert_same(load_rank(found.path, 0), rank_state(0, 1))


def test_a_checkpoint_missing_a_rank_file_is_skipped(tmp_path):
    save_alone(tmp_path, 1)
    (save_alone(tmp_path, 2) / "rank-00000.pt").unlink()
    with pytest.warns(UserWarning, match=r"epoch-00002/rank-00000\.pt: FileNotFoundError"):
        assert find_latest(tmp_path, world_size=1).epoch == 1


def test_prune_keeps_the_newest(tmp_path):
    checkpointer = Checkpointer(tmp_path, Communicator(0, 1), keep=2)
    for epoch in range(1, 6):
        checkpointer.save(epoch, rank_state(0, epoch), None)
    assert epochs_on_disk(tmp_path) == ["epoch-00004", "epoch-00005"]
    Checkpointer(tmp_path, Communicator(0, 1), keep=1).prune()
    assert epochs_on_disk(tmp_path) == ["epoch-00005"]


def test_a_leftover_temporary_folder_is_ignored_then_replaced(tmp_path):
    save_alone(tmp_path, 1)
    leftover = tmp_path / CHECKPOINTS / ".epoch-00002.tmp"  # a writer died while saving epoch 2
    leftover.mkdir()
    (leftover / "rank-00000.pt").write_bytes(b"half a file")
    (leftover / "stray").write_text("from the dead writer")
    assert latest_quietly(tmp_path).epoch == 1
    path = save_alone(tmp_path, 2)
    assert not leftover.exists()
    assert sorted(p.name for p in path.iterdir()) == [COORDINATOR_FILE, MANIFEST, "rank-00000.pt"]
    assert_same(load_rank(path, 0), rank_state(0, 2))
    assert epochs_on_disk(tmp_path) == ["epoch-00001", "epoch-00002"]


def test_saving_the_same_epoch_again_replaces_its_folder(tmp_path):
    first = save_alone(tmp_path, 2, coordinator={"attempt": 1})
    (first / "stray").write_text("from the first attempt")
    checkpointer = Checkpointer(tmp_path, Communicator(0, 1), keep=10)
    again = checkpointer.save(2, rank_state(0, 7), {"attempt": 2})  # redone after a restart, other numbers
    assert again == first
    assert sorted(p.name for p in again.iterdir()) == [COORDINATOR_FILE, MANIFEST, "rank-00000.pt"]
    assert_same(load_rank(again, 0), rank_state(0, 7))
    assert latest_quietly(tmp_path).coordinator["attempt"] == 2


# ---------------------------------------------------------------- random generators


def draws() -> tuple:
    return (torch.rand(4), torch.randint(0, 1000, (3,)), np.random.rand(3), np.random.standard_normal(3),
            random.random(), random.gauss(0, 1), random.randrange(10**9))


def test_random_state_round_trip_through_a_checkpoint(tmp_path):
    torch.manual_seed(3)
    np.random.seed(4)
    random.seed(5)
    draws()  # a cached Gaussian in numpy and in Python, part of the state
    path = Checkpointer(tmp_path, Communicator(0, 1), keep=1).save(1, {"random": random_state(CPU)}, None)
    expected = draws()
    draws()  # move every generator on
    restore_random_state(load_rank(path, 0)["random"], CPU)  # through torch.load(weights_only=True)
    again = draws()
    assert torch.equal(again[0], expected[0]) and torch.equal(again[1], expected[1])
    assert np.array_equal(again[2], expected[2]) and np.array_equal(again[3], expected[3])
    assert again[4:] == expected[4:]


def test_random_state_without_numpy_and_python_restores_torch_only():
    torch.manual_seed(8)
    state = {"torch": random_state(CPU)["torch"]}
    expected = torch.rand(3)
    random.seed(1)
    before = random.random()
    random.seed(1)
    restore_random_state(state, CPU)
    assert torch.equal(torch.rand(3), expected)
    assert random.random() == before  # Python's generator left as it was


# ---------------------------------------------------------------- resuming a changed job


def job(**train):
    return from_dict({
        "model": {"input": [4], "layers": [{"dense": 3}]},
        "data": {"train": "/nowhere/train"},
        "algorithm": {"name": "averaging", "period": "epoch"},
        "train": {"batch_size": 16, "optimizer": {"name": "adam", "lr": 0.01}, "seed": 3, **train},
    })


def write_train_set(path, rows: int, seed: int = 0, source: str = "train.csv") -> str:
    """A training set of `rows` rows of four features and three classes, imported from `source`."""
    generator = np.random.default_rng(seed)
    meta = {"source": {"path": source}}
    with DatasetWriter(str(path), (4,), "float32", classes=[0, 1, 2], extra_meta=meta) as writer:
        writer.write(generator.normal(size=(rows, 4)).astype(np.float32), generator.integers(0, 3, size=rows))
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Training sets by row count, written once for the module."""
    folder, made = tmp_path_factory.mktemp("data"), {}

    def train_set(rows: int = ROWS):
        if rows not in made:
            made[rows] = open_dataset(write_train_set(folder / f"rows-{rows}", rows))
        return made[rows]

    return train_set


def test_fingerprint_names_what_a_resumed_job_must_share(data):
    assert fingerprint(job(), SPEC, data(), 2) == {
        "cluster.workers": 2,
        "cluster.groups": 1,
        "cluster.balance": "equal",
        "algorithm": {"name": "averaging", "period": "epoch", "compression": "none", "compression_rank": 4,
                      "reset_optimizer": False},
        "model": SPEC,
        "train.optimizer.name": "adam",
        "train.optimizer.param_groups": [],
        "train.step": None,
        "data.transform": None,
        "train.validation_split": 0.0,
        "train.batch_size": 16,
        "train.seed": 3,
        "train.shuffle": True,
        "train.loss": "cross_entropy",
        "train.scheduler": None,
        "train.clip_norm": None,
        "train.accumulate": None,
        "train.precision": "fp32",
        "data.train": ROWS,
        "data.train.meta": dataset_identity(data()),
        "data.memory_per_worker": None,
    }


def save_with_fingerprint(run_dir, epoch: int, recorded: dict) -> None:
    save_alone(run_dir, epoch, coordinator={"test": {}, "fingerprint": recorded})


def test_the_same_job_may_resume(tmp_path, data):
    check_resumable(tmp_path, job(), SPEC, data(), 1)  # nothing written yet
    save_with_fingerprint(tmp_path, 1, fingerprint(job(), SPEC, data(), 1))
    check_resumable(tmp_path, job(), SPEC, data(), 1)
    check_resumable(tmp_path, job(epochs=50), SPEC, data(), 1)  # more epochs is what resuming is for


def test_a_changed_batch_size_is_refused_naming_the_key(tmp_path, data):
    save_with_fingerprint(tmp_path, 1, fingerprint(job(), SPEC, data(), 1))
    with pytest.raises(ConfigError) as caught:
        check_resumable(tmp_path, job(batch_size=32), SPEC, data(), 1)
    assert str(caught.value) == (f"train.batch_size: the checkpoints in {tmp_path / CHECKPOINTS} were written with "
                                 "another value (16, now 32); resume with the same one")


def test_a_changed_worker_count_resumes_and_every_other_key_is_still_refused(tmp_path, data):
    save_with_fingerprint(tmp_path, 1, fingerprint(job(), SPEC, data(), 1))
    check_resumable(tmp_path, job(), SPEC, data(), 4)  # resharded, not refused
    with pytest.raises(ConfigError, match=r"^train.batch_size: .* another value \(16, now 32\)"):
        check_resumable(tmp_path, job(batch_size=32), SPEC, data(), 4)


@pytest.mark.parametrize(("key", "train", "spec", "rows", "what"), [
    ("data.train", {}, SPEC, 999, "rows (1000, now 999)"),
    ("train.seed", {"seed": 4}, SPEC, ROWS, "value (3, now 4)"),
    ("train.optimizer.name", {"optimizer": {"name": "sgd", "lr": 0.01}}, SPEC, ROWS, "value ('adam', now 'sgd')"),
    ("model", {}, {"input": [4], "layers": [{"dense": 5}]}, ROWS, "value ("),
])
def test_other_changes_are_refused_naming_the_key(tmp_path, data, key, train, spec, rows, what):
    save_with_fingerprint(tmp_path, 1, fingerprint(job(), SPEC, data(), 1))
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: .* another {re.escape(what)}"):
        check_resumable(tmp_path, job(**train), spec, data(rows), 1)


def test_checkpoints_without_a_fingerprint_refuse_nothing(tmp_path, data):
    save_alone(tmp_path, 1)
    check_resumable(tmp_path, job(batch_size=64), SPEC, data(), 1)
    check_resumable(tmp_path, job(), SPEC, data(), 2)  # another worker count is resharded


def test_resumability_is_read_from_the_newest_readable_checkpoint(tmp_path, data):
    save_with_fingerprint(tmp_path, 1, fingerprint(job(), SPEC, data(), 1))
    newest = save_alone(tmp_path, 2, coordinator={"fingerprint": fingerprint(job(batch_size=8), SPEC, data(), 1)})
    with pytest.raises(ConfigError, match=r"another value \(8, now 16\)"):
        check_resumable(tmp_path, job(), SPEC, data(), 1)
    (newest / COORDINATOR_FILE).write_bytes(b"")  # damaged: the one before decides
    check_resumable(tmp_path, job(), SPEC, data(), 1)
    shutil.rmtree(tmp_path / CHECKPOINTS)
    check_resumable(tmp_path, job(batch_size=8), SPEC, data(), 1)


# ---------------------------------------------------------------- machines without a shared folder


def test_machines_without_a_shared_folder_each_keep_their_own_ranks_files(tmp_path):
    folders = [tmp_path / "host0" / "run", tmp_path / "host1" / "run"]

    def body(comm):
        checkpointer = Checkpointer(folders[comm.rank], comm, keep=2, hosts=["host0", "host1"])
        for epoch in (1, 2):
            checkpointer.save(epoch, rank_state(comm.rank, epoch), {"by": "coordinator"} if comm.rank == 0 else None)
        return checkpointer.keeper

    assert run_ranks(2, body) == [True, True]  # each machine renames its own folder's checkpoint
    own = [sorted(p.name for p in (folder / CHECKPOINTS / "epoch-00002").iterdir()) for folder in folders]
    assert own == [[COORDINATOR_FILE, MANIFEST, "rank-00000.pt"], [MANIFEST, "rank-00001.pt"]]
    assert not list(folders[1].glob(".shoal-folder-*")) and not list(folders[0].glob(".shoal-folder-*"))


def test_a_shared_folder_has_one_keeper_that_checks_every_file(tmp_path):
    def body(comm):
        return Checkpointer(tmp_path, comm, keep=2, hosts=["host0", "host1"]).keeper

    assert run_ranks(2, body) == [True, False]


def test_the_resume_epoch_is_the_newest_every_rank_holds(tmp_path):
    folders = [tmp_path / "host0" / "run", tmp_path / "host1" / "run"]

    def save(comm):
        checkpointer = Checkpointer(folders[comm.rank], comm, keep=5, hosts=["host0", "host1"])
        for epoch in (1, 2):
            checkpointer.save(epoch, rank_state(comm.rank, epoch), {} if comm.rank == 0 else None)

    run_ranks(2, save)
    damaged = folders[1] / CHECKPOINTS / "epoch-00002" / "rank-00001.pt"
    damaged.write_bytes(damaged.read_bytes()[:50])  # host 1's newest file was cut short

    def agree(comm):
        with warnings.catch_warnings(record=True):
            found = agree_on_latest(folders[comm.rank], comm, coordinator=comm.rank == 0)
        return found.epoch, load_rank(folders[comm.rank] / CHECKPOINTS / found.path.name, comm.rank)["global_step"]

    assert run_ranks(2, agree) == [(1, 100), (1, 101)]


# ---------------------------------------------------------------- a full disk, weights that do not fit, none usable


def no_space(*arguments, **options):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def torch_no_space(value, handle, *arguments, **options):
    """What torch raises when the file it writes into fills the disk: its own error, the OSError as its context
    (`from None` hides the context from a traceback but keeps it)."""
    try:
        no_space()
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None


def leftovers_of(run_dir) -> list[str]:
    return sorted(path.name for path in (run_dir / CHECKPOINTS).iterdir() if path.name.startswith("."))


@pytest.mark.parametrize("failure", [no_space, torch_no_space])
def test_a_full_disk_at_a_checkpoint_is_one_line_naming_the_run_dir_and_leaves_no_temporary(tmp_path, monkeypatch,
                                                                                           failure):
    save_alone(tmp_path, 1)
    monkeypatch.setattr(torch, "save", failure)
    with pytest.raises(CheckpointFull) as caught:
        save_alone(tmp_path, 2)
    message = str(caught.value)
    assert message == (f"{tmp_path}: the disk is full: checkpoint of epoch 2 not written (free some space, then "
                       f"--resume {tmp_path})")
    assert isinstance(caught.value, ShoalError) and caught.value.exit_code == 2  # a user error: never restarted
    assert leftovers_of(tmp_path) == [] and epochs_on_disk(tmp_path) == ["epoch-00001"]


def test_a_full_disk_on_one_rank_fails_every_rank_at_once(tmp_path, monkeypatch):
    real_save = torch.save

    def save_unless_rank_1(value, handle, *arguments, **options):
        if value.get("global_step") == 201:  # rank 1's file of epoch 2
            no_space()
        real_save(value, handle, *arguments, **options)

    monkeypatch.setattr(torch, "save", save_unless_rank_1)

    def body(comm):
        checkpointer = Checkpointer(tmp_path, comm, keep=5)
        checkpointer.save(1, rank_state(comm.rank, 1), {} if comm.rank == 0 else None)
        with pytest.raises(CheckpointFull, match="the disk is full: checkpoint of epoch 2"):
            checkpointer.save(2, rank_state(comm.rank, 2), {} if comm.rank == 0 else None)
        return True

    assert run_ranks(2, body, join_timeout=30) == [True, True]
    assert leftovers_of(tmp_path) == [] and epochs_on_disk(tmp_path) == ["epoch-00001"]


def fits_linear(state: dict) -> str:
    return model_misfit(torch.nn.Linear(4, 3).state_dict(), state.get("model"))


def rewrite(folder, name: str, state: dict) -> None:
    """Replace a checkpoint's file and its digest in the manifest: a file written so, not damaged on disk."""
    torch.save(state, folder / name)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"][name] = file_digest(folder / name)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_a_checkpoint_whose_weights_do_not_fit_the_model_is_passed_over_for_the_previous_one(tmp_path):
    save_alone(tmp_path, 1)
    newest = save_alone(tmp_path, 2)
    state = load_rank(newest, 0)
    state["model"] = torch.nn.Linear(5, 3).state_dict()  # rewritten with other shapes
    rewrite(newest, "rank-00000.pt", state)
    expected = (r"skipping damaged checkpoint .*epoch-00002/rank-00000\.pt: its weights do not fit the model "
                r"\('weight': \[3, 5\] in the file, \[3, 4\] in the model\)")
    with pytest.warns(UserWarning, match=expected):
        found = agree_on_latest(tmp_path, Communicator(0, 1), coordinator=True, fits=fits_linear)
    assert found.epoch == 1
    assert_same(load_rank(found.path, 0), rank_state(0, 1))


def test_model_misfit_names_the_first_tensor_that_differs():
    wanted = torch.nn.Linear(4, 3).state_dict()
    assert model_misfit(wanted, torch.nn.Linear(4, 3).state_dict()) == ""
    assert model_misfit(wanted, {"weight": wanted["weight"]}) == \
        "its weights do not fit the model ('bias' is in the model only)"
    assert model_misfit(wanted, None) == "no model weights in it"


def test_when_every_checkpoint_is_damaged_resume_is_refused_naming_the_run_dir(tmp_path):
    for epoch in (1, 2):
        damaged = save_alone(tmp_path, epoch) / "rank-00000.pt"
        damaged.write_bytes(damaged.read_bytes()[:40])
    with warnings.catch_warnings(record=True), pytest.raises(ConfigError) as caught:
        agree_on_latest(tmp_path, Communicator(0, 1), coordinator=True)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{tmp_path}: no checkpoint can be resumed")
    assert "new --run-dir" in message
    shutil.rmtree(tmp_path / CHECKPOINTS)  # no checkpoint at all: a job that failed before its first starts over
    assert agree_on_latest(tmp_path, Communicator(0, 1), coordinator=True) is None
