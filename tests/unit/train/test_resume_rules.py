"""What a resume may change and what it may not, and checkpoints that survive a crash at any step.

An optimizer setting changed on resume takes effect; a key that changes the course of training
is refused with one line naming it; checkpoints are ordered by their epoch number and a save
that dies half-way leaves a checkpoint to resume from.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil

import pytest
import torch

from shoal.algorithms import make_algorithm
from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.config import JobConfig, section_fields
from shoal.data.format import open_dataset
from shoal.errors import ConfigError
from shoal.jobs import from_dict
from shoal.train.checkpoint import (
    CHECKPOINTS,
    COORDINATOR_FILE,
    UNCHECKED,
    Checkpointer,
    check_resumable,
    dataset_identity,
    find_latest,
    fingerprint,
    held_epochs,
    load_rank,
    newest_epoch,
)
from shoal.train.prepare import make_optimizer
from shoal.train.runner import Runner
from shoal.train.state import TrainingState
from tests.unit.train.test_checkpoint import (
    ROWS,
    SPEC,
    assert_same,
    rank_state,
    save_with_fingerprint,
    write_train_set,
)
from tests.unit.train.test_runner import events, weights
from tests.unit.train.test_runner import job as tiny_job

CPU = torch.device("cpu")

# ---------------------------------------------------------------- optimizer settings on resume


class Counter:
    global_step = 0


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    generator = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(8, 4, generator=generator), torch.randint(0, 3, (8,), generator=generator)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    optimizer.step()


def training_state(options: dict) -> tuple[TrainingState, torch.nn.Module, torch.optim.Optimizer]:
    """A rank's state as the runner builds it: a model, the optimizer `train.optimizer` describes."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = make_optimizer(options, model.parameters())
    return TrainingState(model, optimizer, make_algorithm("sync", {}), Counter(), CPU), model, optimizer


def through_a_file(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize(("written", "changed"), [
    ({"name": "adam", "lr": 0.01}, {"lr": 0.1, "betas": [0.5, 0.9], "weight_decay": 0.01, "eps": 1e-6}),
    ({"name": "sgd", "lr": 0.01, "momentum": 0.9}, {"lr": 0.1, "momentum": 0.5, "weight_decay": 0.01}),
])
def test_optimizer_settings_changed_on_resume_take_effect(written, changed):
    state, model, optimizer = training_state(written)
    step(model, optimizer)
    saved = through_a_file(state.state_dict())
    step(model, optimizer)  # the job that was never interrupted

    same_state, same_model, same_optimizer = training_state(written)
    same_state.load_state_dict(saved)
    step(same_model, same_optimizer)
    new_state, new_model, new_optimizer = training_state({**written, **changed})
    new_state.load_state_dict(saved)

    for key, value in changed.items():  # torch keeps betas as a tuple
        assert new_optimizer.param_groups[0][key] == (tuple(value) if isinstance(value, list) else value), key
    assert_same(new_optimizer.state_dict()["state"], saved["optimizer"]["state"])  # moments, momentum kept
    step(new_model, new_optimizer)
    assert torch.equal(same_model.weight, model.weight)  # the unchanged resume is exact
    assert not torch.allclose(new_model.weight, same_model.weight)  # the new settings trained on


def test_a_job_resumed_with_another_lr_trains_on_with_it(tmp_path):
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    Runner(tiny_job(tmp_path, epochs=2), DistInfo(), stopped, threads=1, comm=Communicator(0, 1)).run()
    same, faster = shutil.copytree(stopped, tmp_path / "same"), shutil.copytree(stopped, tmp_path / "faster")
    Runner(tiny_job(tmp_path), DistInfo(), same, threads=1, resume=True, comm=Communicator(0, 1)).run()
    overridden = tiny_job(tmp_path, optimizer={"name": "adam", "lr": 0.1})
    Runner(overridden, DistInfo(), faster, threads=1, resume=True, comm=Communicator(0, 1)).run()
    starts = [record for record in events(faster) if record["event"] in ("job_start", "job_resumed")]
    assert starts[-1]["config"]["train"]["optimizer"]["lr"] == 0.1
    assert not torch.allclose(weights(faster)["0.weight"], weights(same)["0.weight"])


# ---------------------------------------------------------------- the fingerprint


def job(**sections) -> JobConfig:
    raw = {
        "model": {"input": [4], "layers": [{"dense": 3}]},
        "data": {"train": "/nowhere/train"},
        "algorithm": {"name": "averaging", "period": "epoch"},
        "train": {"batch_size": 16, "optimizer": {"name": "adam", "lr": 0.01}, "seed": 3},
    }
    for section, table in sections.items():
        raw[section] = {**raw.get(section, {}), **table}
    return from_dict(raw)


@pytest.fixture(scope="module")
def train_set(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train"
    return open_dataset(write_train_set(path, ROWS))


@pytest.mark.parametrize(("changed", "key", "values"), [
    ({"data": {"memory_per_worker": "1GiB"}}, "data.memory_per_worker", "None, now 1073741824"),
    ({"train": {"shuffle": False}}, "train.shuffle", "True, now False"),
    ({"train": {"loss": "mse"}}, "train.loss", "'cross_entropy', now 'mse'"),
    ({"cluster": {"groups": 2}}, "cluster.groups", "1, now 2"),
    ({"train": {"optimizer": {"name": "sgd", "lr": 0.01}}}, "train.optimizer.name", "'adam', now 'sgd'"),
])
def test_a_key_that_changes_the_result_is_refused_in_one_line(tmp_path, train_set, changed, key, values):
    save_with_fingerprint(tmp_path, 1, fingerprint(job(), SPEC, train_set, 1))
    with pytest.raises(ConfigError) as caught:
        check_resumable(tmp_path, job(**changed), SPEC, train_set, 1)
    assert str(caught.value) == (f"{key}: the checkpoints in {tmp_path / CHECKPOINTS} were written with another "
                                 f"value ({values}); resume with the same one")


def test_another_dataset_of_as_many_rows_is_refused_and_the_same_one_moved_is_not(tmp_path, train_set):
    save_with_fingerprint(tmp_path, 1, fingerprint(job(), SPEC, train_set, 1))
    other = open_dataset(write_train_set(tmp_path / "other", ROWS, source="elsewhere.csv"))
    with pytest.raises(ConfigError) as caught:
        check_resumable(tmp_path, job(), SPEC, other, 1)
    old, new = dataset_identity(train_set), dataset_identity(other)
    assert str(caught.value) == (f"data.train: the checkpoints in {tmp_path / CHECKPOINTS} were written with another "
                                 f"dataset (meta.json sha256 {old[:12]}, now {new[:12]}); resume with the same one")
    moved = shutil.copytree(train_set.path, tmp_path / "moved")
    check_resumable(tmp_path, job(), SPEC, open_dataset(str(moved)), 1)


def test_keys_left_out_of_the_fingerprint_may_change(tmp_path, train_set):
    save_with_fingerprint(tmp_path, 1, fingerprint(job(), SPEC, train_set, 1))
    check_resumable(tmp_path, job(train={"epochs": 9, "eval_every": 2, "optimizer": {"name": "adam", "lr": 0.5}},
                                  data={"test": "/nowhere/test", "cache_dir": "/tmp/cache"},
                                  cluster={"threads": 3, "timeout": 10.0}, checkpoint={"keep": 1, "every": 2},
                                  output={"progress": "none"}), SPEC, train_set, 1)


def test_checkpoints_of_the_previous_fingerprint_compare_the_keys_they_hold(tmp_path, train_set):
    previous = {"cluster.workers": 1, "algorithm": {"name": "averaging", "period": "epoch"}, "model": SPEC,
                "train.optimizer.name": "adam", "train.batch_size": 16, "train.seed": 3, "data.train": ROWS}
    save_with_fingerprint(tmp_path, 1, previous)
    check_resumable(tmp_path, job(train={"shuffle": False}, data={"memory_per_worker": "1GiB"}), SPEC, train_set, 1)
    with pytest.raises(ConfigError) as caught:
        check_resumable(tmp_path, job(train={"batch_size": 32}), SPEC, train_set, 1)
    assert str(caught.value) == (f"train.batch_size: the checkpoints in {tmp_path / CHECKPOINTS} were written with "
                                 "another value (16, now 32); resume with the same one")


def job_keys() -> set[str]:
    keys = {"name"}
    for section, kind in section_fields().items():
        keys |= {f"{section}.{field.name}" for field in dataclasses.fields(kind)}
    return keys


def test_every_job_key_is_in_the_fingerprint_or_said_to_be_safe_to_change(train_set):
    recorded = set(fingerprint(job(), SPEC, train_set, 1)) | {"data.train"}
    sections = {"model", "algorithm"}  # fingerprinted whole: the model's spec, the algorithm and its options
    undecided = {key for key in job_keys()
                 if key not in recorded and key not in UNCHECKED and key.split(".")[0] not in sections}
    assert undecided == set()
    both = {key for key in UNCHECKED if key in recorded}
    assert both == set()
    assert set(UNCHECKED) <= job_keys()


# ---------------------------------------------------------------- order and crashes


def save(run_dir, epoch: int, keep: int = 10, checkpointer: Checkpointer | None = None):
    checkpointer = checkpointer or Checkpointer(run_dir, Communicator(0, 1), keep)
    return checkpointer.save(epoch, rank_state(0, epoch % 7), {"test": {"epoch": epoch}})


def test_epoch_100000_is_newer_than_99999(tmp_path):
    for epoch in (99_998, 99_999, 100_000):
        save(tmp_path, epoch)
    assert find_latest(tmp_path, world_size=1).epoch == 100_000
    assert newest_epoch(tmp_path) == 100_000
    assert held_epochs(tmp_path, 0) == [100_000, 99_999, 99_998]
    Checkpointer(tmp_path, Communicator(0, 1), keep=2).prune()
    assert sorted(path.name for path in (tmp_path / CHECKPOINTS).iterdir()) == ["epoch-100000", "epoch-99999"]


def test_a_save_that_died_before_its_rename_leaves_the_previous_checkpoint(tmp_path):
    save(tmp_path, 1, keep=1)
    written = save(tmp_path / "elsewhere", 2)
    shutil.move(written, tmp_path / CHECKPOINTS / ".epoch-00002.tmp")  # every file there, never renamed
    assert find_latest(tmp_path, world_size=1).epoch == 1
    assert newest_epoch(tmp_path) == 1
    save(tmp_path, 2, keep=1)
    assert sorted(path.name for path in (tmp_path / CHECKPOINTS).iterdir()) == ["epoch-00002"]


def test_a_redone_epoch_whose_save_died_between_its_renames_is_still_found(tmp_path):
    save(tmp_path, 1)
    first = save(tmp_path, 2)
    aside = tmp_path / CHECKPOINTS / ".epoch-00002.old"
    os.rename(first, aside)  # the redo moved the old folder aside and died before its own rename
    found = find_latest(tmp_path, world_size=1)
    assert (found.path, found.epoch, found.coordinator["test"]) == (aside, 2, {"epoch": 2})
    assert held_epochs(tmp_path, 0) == [2, 1]
    assert load_rank(found.path, 0)["global_step"] == 200
    again = save(tmp_path, 2)
    assert sorted(path.name for path in (tmp_path / CHECKPOINTS).iterdir()) == ["epoch-00001", "epoch-00002"]
    assert find_latest(tmp_path, world_size=1).path == again


def test_a_checkpoint_is_on_disk_before_it_is_renamed_and_before_older_ones_go(tmp_path, monkeypatch):
    save(tmp_path, 1, keep=1)
    events = []
    real_fsync, real_rename, real_rmtree = os.fsync, os.rename, shutil.rmtree

    def fsync(descriptor):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        real_fsync(descriptor)

    def rename(source, target):
        events.append(("rename", str(source), str(target)))
        real_rename(source, target)

    def rmtree(path, *args, **kwargs):
        events.append(("rmtree", str(path)))
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    checkpointer = Checkpointer(tmp_path, Communicator(0, 1), keep=1)
    save(tmp_path, 1, checkpointer=checkpointer)  # the same epoch again, then the next
    save(tmp_path, 2, checkpointer=checkpointer)

    root = tmp_path / CHECKPOINTS

    def publishing(rest, epoch):  # the rename of the temporary folder, whose name is unpredictable, into place
        return next(index for index, event in enumerate(rest) if event[0] == "rename"
                    and event[2] == str(root / f"epoch-0000{epoch}") and event[1].endswith(".tmp"))

    for epoch, rest in ((1, events), (2, events[publishing(events, 1) + 1:])):
        published = publishing(rest, epoch)
        temporary, final = rest[published][1], str(root / f"epoch-0000{epoch}")
        synced = {event[1] for event in rest[:published] if event[0] == "fsync"}
        assert {temporary, f"{temporary}/rank-00000.pt", f"{temporary}/{COORDINATOR_FILE}"} <= synced
        assert ("rmtree", final) not in rest[:published]  # never a moment with neither copy
        on_disk = rest.index(("fsync", str(root)), published)
        removed = [event for event in rest if event[0] == "rmtree" and event[1].startswith(str(root / "epoch"))]
        assert all(rest.index(event) > on_disk for event in removed)
    assert ("rename", str(root / "epoch-00001"), str(root / ".epoch-00001.old")) in events
    assert sorted(path.name for path in root.iterdir()) == ["epoch-00002"]


def test_an_algorithm_option_added_since_counts_as_its_default(tmp_path, train_set):
    """Checkpoints written before algorithm.compression existed ran without it: they resume while the job
    leaves it at "none", and are refused when it asks for a compression."""
    previous = fingerprint(job(), SPEC, train_set, 1)
    previous["algorithm"] = {key: value for key, value in previous["algorithm"].items()
                             if key not in ("compression", "compression_rank")}
    save_with_fingerprint(tmp_path, 1, previous)
    check_resumable(tmp_path, job(), SPEC, train_set, 1)
    with pytest.raises(ConfigError, match=r"^algorithm: the checkpoints in .* another value"):
        check_resumable(tmp_path, job(algorithm={"name": "averaging", "compression": "bf16"}), SPEC, train_set, 1)
