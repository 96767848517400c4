"""Checkpoint digests without processes: the manifest each save writes, and what a flipped bit does on resume."""

from __future__ import annotations

import hashlib
import io
import json
import warnings

import pytest
import torch

from shoal.cluster.collectives import Communicator
from shoal.cluster.fake import run_ranks
from shoal.train.checkpoint import CHECKPOINTS, COORDINATOR_FILE, Checkpointer, agree_on_latest, load_rank, random_state
from shoal.train.manifest import MANIFEST, Hashing, file_digest, verify
from tests.unit.train.test_checkpoint import assert_same
from tests.unit.train.test_checkpoint import rank_state as counters_state

CPU = torch.device("cpu")


def rank_state(rank: int, epoch: int) -> dict:
    """A rank's state with its random generators, as the runner writes it."""
    return {**counters_state(rank, epoch), "random": random_state(CPU)}


def save_alone(run_dir, epoch: int):
    return Checkpointer(run_dir, Communicator(0, 1), keep=10).save(epoch, rank_state(0, epoch), {})


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def flip_a_bit(path, tensor: torch.Tensor) -> None:
    """Flip one bit of `tensor`'s first element where the file holds it (the file still loads)."""
    raw = tensor.contiguous().numpy().tobytes()
    content = bytearray(path.read_bytes())
    assert content.count(raw) == 1
    content[content.find(raw) + tensor.element_size() - 1] ^= 0x40
    path.write_bytes(bytes(content))
    torch.load(path, weights_only=True)


def test_hashing_a_write_gives_the_digest_of_what_torch_wrote():
    buffer = io.BytesIO()
    hashing = Hashing(buffer)
    torch.save(rank_state(0, 1), hashing)
    assert hashing.hexdigest() == hashlib.sha256(buffer.getvalue()).hexdigest()


def test_a_save_records_the_digest_of_every_file_of_its_folder(tmp_path):
    folder = save_alone(tmp_path, 1)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["algorithm"] == "sha256"
    assert manifest["files"] == {name: sha256(folder / name) for name in (COORDINATOR_FILE, "rank-00000.pt")}
    assert manifest["save"] == torch.load(folder / COORDINATOR_FILE, weights_only=True)["save"]
    assert file_digest(folder / "rank-00000.pt") == manifest["files"]["rank-00000.pt"]
    assert verify(folder / "rank-00000.pt") == verify(folder / COORDINATOR_FILE) == ""


def test_each_machines_folder_names_its_own_files(tmp_path):
    folders = [tmp_path / "host0" / "run", tmp_path / "host1" / "run"]

    def body(comm):
        Checkpointer(folders[comm.rank], comm, keep=2, hosts=["host0", "host1"]).save(
            1, rank_state(comm.rank, 1), {} if comm.rank == 0 else None)

    run_ranks(2, body)
    named = [json.loads((folder / CHECKPOINTS / "epoch-00001" / MANIFEST).read_text())["files"] for folder in folders]
    assert [sorted(files) for files in named] == [[COORDINATOR_FILE, "rank-00000.pt"], ["rank-00001.pt"]]
    assert named[1]["rank-00001.pt"] == sha256(folders[1] / CHECKPOINTS / "epoch-00001" / "rank-00001.pt")


@pytest.mark.parametrize("part", ["weight", "moment", "generator"])
def test_a_bit_flipped_in_any_tensor_of_the_newest_checkpoint_is_passed_over_naming_the_file(tmp_path, part):
    save_alone(tmp_path, 1)
    newest = save_alone(tmp_path, 2) / "rank-00000.pt"
    state = torch.load(newest, weights_only=True)
    tensor = {"weight": state["model"]["weight"], "moment": state["optimizer"]["state"][1]["exp_avg"],
              "generator": state["random"]["torch"]}[part]
    flip_a_bit(newest, tensor)
    expected = (r"^skipping damaged checkpoint checkpoints/epoch-00002/rank-00000\.pt: its sha256 digest differs "
                r"from the one manifest\.json recorded")
    with pytest.warns(UserWarning, match=expected):
        found = agree_on_latest(tmp_path, Communicator(0, 1), coordinator=True)
    assert found.epoch == 1


def test_a_bit_flipped_in_the_coordinator_file_is_passed_over_too(tmp_path):
    save_alone(tmp_path, 1)
    coordinator = save_alone(tmp_path, 2) / COORDINATOR_FILE
    content = bytearray(coordinator.read_bytes())
    content[len(content) // 2] ^= 0x01
    coordinator.write_bytes(bytes(content))
    with pytest.warns(UserWarning, match=r"checkpoints/epoch-00002/coordinator\.pt: its sha256 digest differs"):
        found = agree_on_latest(tmp_path, Communicator(0, 1), coordinator=True)
    assert found.epoch == 1


def test_every_rank_agrees_on_the_epoch_before_when_one_ranks_newest_file_is_damaged(tmp_path):
    def save(comm):
        checkpointer = Checkpointer(tmp_path, comm, keep=5)
        for epoch in (1, 2):
            checkpointer.save(epoch, rank_state(comm.rank, epoch), {} if comm.rank == 0 else None)

    run_ranks(2, save)
    damaged = tmp_path / CHECKPOINTS / "epoch-00002" / "rank-00001.pt"
    flip_a_bit(damaged, torch.load(damaged, weights_only=True)["model"]["bias"])

    def agree(comm):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = agree_on_latest(tmp_path, comm, coordinator=comm.rank == 0)
        return found.epoch, found.reshard, [str(warning.message) for warning in caught]

    (epoch0, reshard0, said0), (epoch1, reshard1, said1) = run_ranks(2, agree)
    assert (epoch0, reshard0, epoch1, reshard1) == (1, False, 1, False)  # exact, the same epoch on both
    assert any(text.startswith("skipping damaged checkpoint checkpoints/epoch-00002/rank-00001.pt") for text in said1)


def test_a_manifest_that_cannot_be_read_passes_over_its_whole_folder(tmp_path):
    save_alone(tmp_path, 1)
    newest = save_alone(tmp_path, 2)
    (newest / MANIFEST).write_text("{not json")
    assert verify(newest / "rank-00000.pt") == "its manifest.json cannot be read (JSONDecodeError)"
    (newest / MANIFEST).write_text(json.dumps({"algorithm": "md5", "files": {}}))
    assert "manifest.json is damaged" in verify(newest / "rank-00000.pt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert agree_on_latest(tmp_path, Communicator(0, 1), coordinator=True).epoch == 1
    said = "\n".join(str(warning.message) for warning in caught)
    for name in ("rank-00000.pt", COORDINATOR_FILE):
        assert f"checkpoints/epoch-00002/{name}: its manifest.json is damaged" in said, said


def test_a_file_the_manifest_does_not_name_is_not_read(tmp_path):
    newest = save_alone(tmp_path, 1)
    (newest / "rank-00001.pt").write_bytes((newest / "rank-00000.pt").read_bytes())  # a stray file of no save
    assert verify(newest / "rank-00001.pt").startswith("not named in its folder's manifest.json")
    with pytest.raises(FileNotFoundError):
        verify(newest / "rank-00002.pt")


def test_a_checkpoint_written_before_manifests_is_read_as_before(tmp_path):
    folder = save_alone(tmp_path, 1)
    (folder / MANIFEST).unlink()
    assert verify(folder / "rank-00000.pt") == ""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert agree_on_latest(tmp_path, Communicator(0, 1), coordinator=True).epoch == 1
    assert_same(load_rank(folder, 0), rank_state(0, 1) | {"random": load_rank(folder, 0)["random"]})


def test_a_file_changed_after_it_was_chosen_is_never_applied(tmp_path):
    folder = save_alone(tmp_path, 1)
    found = agree_on_latest(tmp_path, Communicator(0, 1), coordinator=True)
    flip_a_bit(folder / "rank-00000.pt", torch.load(folder / "rank-00000.pt", weights_only=True)["model"]["weight"])
    with pytest.raises(RuntimeError, match=r"^damaged checkpoint checkpoints/epoch-00001/rank-00000\.pt: its sha256"):
        load_rank(found.path, 0)
    with pytest.raises(RuntimeError, match=r"rank-00000\.pt: no good"):
        load_rank(save_alone(tmp_path, 2), 0, fits=lambda state: "no good")


def test_a_reshard_passes_over_a_damaged_rank_0_file_for_the_epoch_before(tmp_path):
    def save(comm):
        checkpointer = Checkpointer(tmp_path, comm, keep=5)
        for epoch in (1, 2):
            checkpointer.save(epoch, rank_state(comm.rank, epoch), {} if comm.rank == 0 else None)

    run_ranks(2, save)
    damaged = tmp_path / CHECKPOINTS / "epoch-00002" / "rank-00000.pt"
    flip_a_bit(damaged, torch.load(damaged, weights_only=True)["optimizer"]["state"][0]["exp_avg_sq"])
    with pytest.warns(UserWarning, match=r"^skipping damaged checkpoint checkpoints/epoch-00002/rank-00000\.pt"):
        found = agree_on_latest(tmp_path, Communicator(0, 1), coordinator=True)  # 2 workers' files, now 1
    assert (found.epoch, found.reshard) == (1, True)
