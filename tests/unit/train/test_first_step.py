"""A resume that fails before its first step: the rank's note, and the next resume taking the epoch before."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.train.checkpoint import CHECKPOINTS, agree_on_latest, newest_epoch, untried
from shoal.train.first_step import FirstStep, failed_saves
from shoal.train.runner import Runner
from tests.unit.train.test_checkpoint import save_alone
from tests.unit.train.test_runner import events
from tests.unit.train.test_runner import job as tiny_job


def save_id(run_dir, epoch: int) -> str:
    return torch.load(run_dir / CHECKPOINTS / f"epoch-{epoch:05d}" / "coordinator.pt", weights_only=True)["save"]


def test_a_note_lives_from_the_resume_to_the_first_step(tmp_path):
    note = FirstStep(tmp_path / CHECKPOINTS, 3)
    assert note.failed == [] and not note.path.exists()
    note.begin(2, "save-2")
    assert note.path.name == "resumed-rank-00003.json"
    assert json.loads(note.path.read_text()) == {"resuming": [2, "save-2"], "failed": []}
    assert failed_saves(tmp_path / CHECKPOINTS) == {(2, "save-2")}  # as the launcher sees it, should this fail
    note.done()
    assert not note.path.exists() and failed_saves(tmp_path / CHECKPOINTS) == set()
    note.done()  # once only


def test_a_note_left_behind_names_a_failed_save_until_the_run_moves_on(tmp_path):
    FirstStep(tmp_path, 0).begin(2, "save-2")  # and never a first step
    again = FirstStep(tmp_path, 0)
    assert again.failed == [(2, "save-2")]
    again.begin(1, "save-1")
    again.done()
    assert json.loads(again.path.read_text()) == {"resuming": None, "failed": [[2, "save-2"]]}
    assert FirstStep(tmp_path, 0).failed == [(2, "save-2")]
    assert FirstStep(tmp_path, 1).failed == []  # each rank its own


def test_a_note_that_cannot_be_read_is_ignored_with_a_warning(tmp_path):
    (tmp_path / "resumed-rank-00000.json").write_text("[1, 2")
    with pytest.warns(UserWarning, match=r"resumed-rank-00000\.json: not a note of a resume"):
        assert FirstStep(tmp_path, 0).failed == []


def test_a_failed_save_is_passed_over_naming_the_file_unless_none_is_left(tmp_path):
    held = {2: "save-2", 1: "save-1"}
    with pytest.warns(UserWarning, match=r"^skipping checkpoint checkpoints/epoch-00002/rank-00001\.pt: the last "
                                         r"resume from it failed before its first step$"):
        assert untried(tmp_path, 1, held, [(2, "save-2")]) == {1: "save-1"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert untried(tmp_path, 1, held, [(2, "another save of epoch 2")]) == held
    with pytest.warns(UserWarning, match=r"every checkpoint of rank 1 failed .* trying checkpoints/epoch-00002/"):
        assert untried(tmp_path, 1, held, [(2, "save-2"), (1, "save-1")]) == held


def test_the_resume_and_the_launchers_restart_go_on_from_the_epoch_before(tmp_path):
    for epoch in (1, 2):
        save_alone(tmp_path, epoch)
    FirstStep(tmp_path / CHECKPOINTS, 0).begin(2, save_id(tmp_path, 2))
    assert newest_epoch(tmp_path) == 1
    note = FirstStep(tmp_path / CHECKPOINTS, 0)
    with pytest.warns(UserWarning, match="epoch-00002/rank-00000.pt: the last resume from it failed"):
        assert agree_on_latest(tmp_path, Communicator(0, 1), coordinator=True, failed=note.failed).epoch == 1


def test_a_runner_that_failed_before_its_first_step_resumes_from_the_epoch_before(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    Runner(tiny_job(tmp_path, epochs=2), DistInfo(), run_dir, threads=1, comm=Communicator(0, 1)).run()
    failing = Runner(tiny_job(tmp_path, epochs=3), DistInfo(), run_dir, threads=1, resume=True,
                     comm=Communicator(0, 1))

    def first_step_fails(epoch):
        raise RuntimeError("the first step fails")

    failing.run_epoch = first_step_fails
    with pytest.raises(RuntimeError, match="the first step fails"):
        failing.run()
    with pytest.warns(UserWarning, match=r"checkpoints/epoch-00002/rank-00000\.pt: the last resume from it failed"):
        Runner(tiny_job(tmp_path, epochs=3), DistInfo(), run_dir, threads=1, resume=True,
               comm=Communicator(0, 1)).run()
    assert [record["from_epoch"] for record in events(run_dir) if record["event"] == "job_resumed"] == [2, 1]
    assert events(run_dir)[-1]["event"] == "job_end" and events(run_dir)[-1]["status"] == "completed"
    note = json.loads((run_dir / CHECKPOINTS / "resumed-rank-00000.json").read_text())
    assert note["resuming"] is None and [epoch for epoch, _ in note["failed"]] == [2]


def test_a_save_tried_again_that_gets_through_its_first_step_fails_no_more(tmp_path):
    FirstStep(tmp_path, 0).begin(2, "save-2")
    again = FirstStep(tmp_path, 0)
    again.begin(2, "save-2")  # every checkpoint had failed: the newest is tried again
    again.done()
    assert not again.path.exists() and FirstStep(tmp_path, 0).failed == []
