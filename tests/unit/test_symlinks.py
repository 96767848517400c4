"""No write in a run directory goes through a symbolic link, and nothing outside it is deleted.

Each test plants a link where shoal keeps one of its files or folders, pointing at a victim
outside the run directory, and checks that shoal refuses in one line naming the link (or writes
beside it, never through it) and that the victim is exactly as it was.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from shoal.cluster.collectives import Communicator
from shoal.durable import write_text_durably
from shoal.errors import ConfigError
from shoal.events import EVENTS_FILE, Checkpoint, EventLog, append_event
from shoal.jobs import from_dict
from shoal.run.artifacts import MODEL_FILE, save_model
from shoal.run.directory import JOB_FILE, new_run_dir, write_job_file
from shoal.run.lock import KEPT, LOCK_FILE, hold_run_dir
from shoal.run.report import REPORT_FILE, save_atomically, write_report
from shoal.train.checkpoint import CHECKPOINTS, Checkpointer, checkpoint_folders, folder_name
from shoal.train.loggers.to_csv import CSV_FILE, CsvLogger

VICTIM_TEXT = "the user's own file, not shoal's\n"


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_text(VICTIM_TEXT)
    return path


@pytest.fixture
def run(tmp_path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return run_dir


def refused(call, *arguments, link: Path) -> str:
    """The one-line ConfigError `call` raises, which names `link`."""
    with pytest.raises(ConfigError) as caught:
        call(*arguments)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{link}: a symbolic link"), message
    return message


def demo_job():
    return from_dict({"model": {"input": [4], "layers": [{"dense": 2}]}, "data": {"train": "/nowhere/train"}},
                     name="demo")


def enter(run_dir: Path) -> None:
    with hold_run_dir(run_dir):
        pass


def test_the_names_the_lock_guards_are_the_writers_own():
    assert {LOCK_FILE, JOB_FILE, EVENTS_FILE, MODEL_FILE, CSV_FILE, REPORT_FILE, CHECKPOINTS} <= set(KEPT)


def test_a_lock_link_is_refused_on_resume_and_for_a_new_run_dir(run, victim):
    (run / LOCK_FILE).symlink_to(victim)
    append_event(run, Checkpoint(epoch=1, path="p"))  # a run to resume
    refused(enter, run, link=run / LOCK_FILE)
    fresh = run.parent / "fresh"
    fresh.mkdir()
    (fresh / LOCK_FILE).symlink_to(victim)
    refused(enter, new_run_dir(demo_job(), fresh), link=fresh / LOCK_FILE)
    assert victim.read_text() == VICTIM_TEXT


@pytest.mark.parametrize("name", [EVENTS_FILE, JOB_FILE, MODEL_FILE, CSV_FILE, REPORT_FILE, CHECKPOINTS])
def test_taking_the_run_dir_refuses_a_link_where_shoal_keeps_a_file(run, victim, name):
    (run / name).symlink_to(victim)
    refused(enter, run, link=run / name)
    assert victim.read_text() == VICTIM_TEXT
    assert not (run / LOCK_FILE).exists()  # refused before anything was written


def test_events_are_never_appended_through_a_link(run, victim):
    (run / EVENTS_FILE).symlink_to(victim)
    refused(EventLog, run, link=run / EVENTS_FILE)
    refused(append_event, run, Checkpoint(epoch=1, path="p"), link=run / EVENTS_FILE)
    assert victim.read_text() == VICTIM_TEXT


def test_the_job_file_is_never_written_through_a_link(run, victim):
    (run / JOB_FILE).symlink_to(victim)
    refused(write_job_file, run, demo_job(), link=run / JOB_FILE)
    refused(new_run_dir, demo_job(), run, link=run / JOB_FILE)
    assert victim.read_text() == VICTIM_TEXT


def save_demo_model(run_dir: Path) -> Path:
    return save_model(run_dir, torch.nn.Linear(4, 2), {"input": [4], "layers": [{"dense": 2}]},
                      "cross_entropy", [0, 1], "float32")


def test_model_pt_is_never_written_through_a_link_nor_through_its_old_temporary_name(run, victim):
    (run / "model.pt.tmp").symlink_to(victim)  # the fixed temporary name of earlier versions
    path = save_demo_model(run)
    assert path == run / MODEL_FILE and not path.is_symlink()
    assert torch.load(path, weights_only=True)["classes"] == [0, 1]
    path.unlink()
    path.symlink_to(victim)
    refused(save_demo_model, run, link=path)
    assert victim.read_text() == VICTIM_TEXT
    assert sorted(entry.name for entry in run.iterdir()) == [MODEL_FILE, "model.pt.tmp"]  # no temporary left


def test_metrics_csv_is_never_opened_through_a_link(run, victim):
    (run / CSV_FILE).symlink_to(victim)
    refused(CsvLogger, run, ["accuracy"], link=run / CSV_FILE)
    assert victim.read_text() == VICTIM_TEXT


def test_report_and_plots_are_never_written_through_a_link(run, victim):
    append_event(run, Checkpoint(epoch=1, path="p"))
    (run / REPORT_FILE).symlink_to(victim)
    refused(write_report, run, link=run / REPORT_FILE)
    planted = run / f".{REPORT_FILE}.{os.getpid()}.tmp"  # the predictable temporary name of earlier versions
    planted.symlink_to(victim)
    (run / REPORT_FILE).unlink()
    save_atomically(run / REPORT_FILE, lambda temporary: temporary.write_text("# report\n"))
    assert (run / REPORT_FILE).read_text() == "# report\n"
    assert victim.read_text() == VICTIM_TEXT


def test_a_durable_write_refuses_a_link(run, victim):
    (run / "notes.json").symlink_to(victim)
    refused(write_text_durably, run / "notes.json", "{}", link=run / "notes.json")
    assert victim.read_text() == VICTIM_TEXT


# ---------------------------------------------------------------- checkpoints: nothing outside is deleted


def rank_state(epoch: int) -> dict:
    return {"model": torch.nn.Linear(4, 3).state_dict(), "global_step": epoch}


def users_folder(tmp_path: Path) -> Path:
    """A folder of the user's, laid out as checkpoints are: what pruning must never touch."""
    folder = tmp_path / "mine"
    (folder / folder_name(1)).mkdir(parents=True)
    (folder / folder_name(1) / "thesis.tex").write_text(VICTIM_TEXT)
    return folder


def test_a_checkpoints_link_is_refused_and_its_target_kept(tmp_path, run):
    mine = users_folder(tmp_path)
    (run / CHECKPOINTS).symlink_to(mine)
    refused(Checkpointer, run, Communicator(0, 1), 1, link=run / CHECKPOINTS)
    assert (mine / folder_name(1) / "thesis.tex").read_text() == VICTIM_TEXT


def test_an_epoch_link_is_neither_read_nor_pruned(tmp_path, run):
    mine = users_folder(tmp_path)
    (run / CHECKPOINTS).mkdir()
    (run / CHECKPOINTS / folder_name(1)).symlink_to(mine / folder_name(1))
    checkpointer = Checkpointer(run, Communicator(0, 1), keep=1)
    for epoch in (2, 3):
        checkpointer.save(epoch, rank_state(epoch), {})
    assert [epoch for epoch, _ in checkpoint_folders(run)] == [3]
    assert (mine / folder_name(1) / "thesis.tex").read_text() == VICTIM_TEXT


def test_a_link_at_the_epoch_being_written_goes_but_not_its_target(tmp_path, run):
    mine = users_folder(tmp_path)
    (run / CHECKPOINTS).mkdir()
    (run / CHECKPOINTS / folder_name(1)).symlink_to(mine / folder_name(1))
    (run / CHECKPOINTS / f".{folder_name(1)}.tmp").symlink_to(mine / folder_name(1))  # the old fixed temporary name
    path = Checkpointer(run, Communicator(0, 1), keep=5).save(1, rank_state(1), {})
    assert not path.is_symlink() and sorted(entry.name for entry in path.iterdir()) == ["coordinator.pt",
                                                                                       "manifest.json",
                                                                                       "rank-00000.pt"]
    assert sorted(entry.name for entry in (mine / folder_name(1)).iterdir()) == ["thesis.tex"]
    assert (mine / folder_name(1) / "thesis.tex").read_text() == VICTIM_TEXT


def test_a_shipped_model_object_is_never_written_through_a_link(run, victim):
    from shoal.objects import save_object

    path = run / "model.object.pkl"
    (run / ".model.object.pkl.tmp").symlink_to(victim)  # the fixed temporary name of earlier versions
    save_object(torch.nn.Linear(2, 1), path, "model")
    assert victim.read_text() == VICTIM_TEXT and not path.is_symlink()
    path.unlink()
    path.symlink_to(victim)
    refused(save_object, torch.nn.Linear(2, 1), path, "model", link=path)
    assert victim.read_text() == VICTIM_TEXT


# ---------------------------------------------------------------- the loggers' own folders


def test_mlflow_never_appends_through_a_link_inside_the_runs_mlruns(run, victim):
    pytest.importorskip("mlflow")
    from mlflow.entities import Metric

    from shoal.train.loggers.to_mlflow import MlflowLogger

    victim.write_text("0 0.5 0\n")  # laid out as an MLflow metric file, so MLflow appends to it
    MlflowLogger(run, None, "demo")
    metrics = next((run / "mlruns").glob("*/*/metrics"))
    (metrics / "train_loss").symlink_to(victim)
    refused(MlflowLogger, run, None, "demo", link=metrics / "train_loss")  # the resumed job's logger
    assert victim.read_text() == "0 0.5 0\n"
    (metrics / "train_loss").unlink()
    logger = MlflowLogger(run, None, "demo")  # without the link, the same run goes on
    logger.client.log_batch(logger.run_id, metrics=[Metric("train_loss", 1.0, 0, 1)])
    assert (metrics / "train_loss").read_text().split() == ["0", "1.0", "1"]


def test_tensorboard_never_writes_through_a_link_inside_its_folder(run, victim):
    pytest.importorskip("tensorboard")
    from shoal.train.loggers.to_tensorboard import TENSORBOARD_FOLDER, TensorBoardLogger

    (run / TENSORBOARD_FOLDER).mkdir()
    planted = run / TENSORBOARD_FOLDER / "events.out.tfevents.1700000000.host.4242.0"  # a name it may pick
    planted.symlink_to(victim)
    refused(TensorBoardLogger, run, link=planted)
    assert victim.read_text() == VICTIM_TEXT


def test_a_studys_trials_never_go_through_a_link(tmp_path, victim):
    from shoal.bench.study import TRIALS_FILE, write_trials
    out = tmp_path / "study"
    out.mkdir()
    (out / "trials.csv.tmp").symlink_to(victim)  # the fixed temporary name of earlier versions
    write_trials(out, [])
    assert (out / TRIALS_FILE).read_text().startswith("size,") and victim.read_text() == VICTIM_TEXT
    (out / TRIALS_FILE).unlink()
    (out / TRIALS_FILE).symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_trials(out, [])
    assert victim.read_text() == VICTIM_TEXT
