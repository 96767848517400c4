"""The run directory: held by one job at a time, a resolved job file written whole and never over the user's own,
and a --run-dir that cannot be a folder refused in one line; whether a job holds it, only looked at. (Held
against another process: tests/processes/run/test_directory.py.)"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from shoal.errors import ConfigError
from shoal.events import Checkpoint, append_event
from shoal.jobs import from_dict, load_job
from shoal.run.directory import JOB_FILE, MARKER, new_run_dir, write_job_file
from shoal.run.lock import LOCK_FILE, held, hold_run_dir

USERS_JOB = textwrap.dedent("""\
    # my experiment: keep these notes
    [model]
    input = [4]
    layers = [{ dense = 2 }]  # two classes

    [data]
    train = "/nowhere/train"
""")


def demo_job(epochs: int = 1):
    return from_dict({"model": {"input": [4], "layers": [{"dense": 2}]}, "data": {"train": "/nowhere/train"},
                      "train": {"epochs": epochs}}, name="demo")


def enter(run_dir: Path) -> None:
    with hold_run_dir(run_dir):
        pass


def one_line_error(call, *arguments) -> str:
    with pytest.raises(ConfigError) as caught:
        call(*arguments)
    message = str(caught.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- the job file


def test_the_resolved_job_file_opens_with_the_marker_and_reads_back_as_the_job(tmp_path):
    job = demo_job(epochs=3)
    path = write_job_file(tmp_path, job)
    assert path == tmp_path / JOB_FILE
    assert path.read_text().splitlines()[0] == MARKER
    assert load_job(path).to_dict() == job.to_dict()
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [JOB_FILE]  # no temporary file left behind


def test_shoals_own_job_file_is_replaced_on_a_resume(tmp_path):
    write_job_file(tmp_path, demo_job(epochs=1))
    write_job_file(tmp_path, demo_job(epochs=5))
    assert load_job(tmp_path / JOB_FILE).train.epochs == 5


def test_the_users_job_file_in_the_run_directory_is_kept_byte_for_byte(tmp_path):
    users = tmp_path / JOB_FILE
    users.write_text(USERS_JOB)
    expected = (f"{users}: not written by shoal (its first line is not {MARKER!r}), so shoal will not replace it; "
                "choose another --run-dir")
    assert one_line_error(new_run_dir, demo_job(), tmp_path) == expected
    assert one_line_error(write_job_file, tmp_path, demo_job()) == expected
    assert users.read_text() == USERS_JOB
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [JOB_FILE]


def test_a_worker_keeps_whatever_job_file_is_there(tmp_path):
    (tmp_path / JOB_FILE).write_text(USERS_JOB)
    assert write_job_file(tmp_path, demo_job(), replace=False).read_text() == USERS_JOB


def test_a_job_file_beside_a_runs_events_is_the_runs_own(tmp_path):
    """A run from a shoal that wrote no marker still resumes: its job file is replaced."""
    (tmp_path / JOB_FILE).write_text(demo_job(epochs=1).to_toml())
    append_event(tmp_path, Checkpoint(epoch=1, path="checkpoints/epoch-1"))
    write_job_file(tmp_path, demo_job(epochs=4))
    assert load_job(tmp_path / JOB_FILE).train.epochs == 4


# ---------------------------------------------------------------- choosing a new run directory


def test_a_run_dir_naming_a_file_is_refused(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert one_line_error(new_run_dir, demo_job(), notes) == \
        f"{notes}: is a file, not a folder; choose another --run-dir"
    assert notes.read_text() == "mine"


def test_a_run_dir_under_a_file_is_refused(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    run_dir = notes / "deeper" / "run"
    assert one_line_error(new_run_dir, demo_job(), run_dir) == \
        f"{run_dir}: cannot be a folder: {notes} is a file; choose another --run-dir"
    assert one_line_error(enter, run_dir).startswith(f"{run_dir}: cannot use as a run directory: ")


def test_the_default_run_dir_under_a_file_named_runs_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("runs").write_text("mine")
    message = one_line_error(new_run_dir, demo_job(), None)
    assert message.startswith("runs/demo-") and message.endswith(": cannot be a folder: runs is a file; "
                                                                  "choose another --run-dir")


def test_a_folder_holding_a_run_is_refused_and_an_empty_one_taken(tmp_path):
    assert new_run_dir(demo_job(), tmp_path / "new") == tmp_path / "new"
    append_event(tmp_path, Checkpoint(epoch=1, path="p"))
    assert one_line_error(new_run_dir, demo_job(), tmp_path) == \
        f"{tmp_path}: already holds a run; choose another --run-dir"


@pytest.mark.parametrize("name", ["../../x", "a/b", "/tmp/x", "..", ".", "a\\b"])
def test_a_job_name_that_is_not_one_plain_name_is_refused_naming_the_key(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    job = from_dict({"model": {"input": [4], "layers": [{"dense": 2}]}, "data": {"train": "/nowhere/train"}},
                    name=name)
    message = one_line_error(new_run_dir, job, None)
    assert message.startswith(f"name: {name!r} is not a plain name")
    assert os.listdir(tmp_path) == []  # no runs/ folder, nothing anywhere else


def test_a_plain_job_name_with_dots_names_its_folder_under_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = from_dict({"model": {"input": [4], "layers": [{"dense": 2}]}, "data": {"train": "/nowhere/train"}},
                    name="v1..2")
    assert new_run_dir(job, None).parent == Path("runs")


# ---------------------------------------------------------------- held: whether a job is still there


def test_held_says_whether_a_job_holds_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    assert held(run_dir) is None  # no folder
    run_dir.mkdir()
    assert held(run_dir) is None and not (run_dir / LOCK_FILE).exists()  # no lock file, and none is made
    with hold_run_dir(run_dir):
        assert held(run_dir) is True
        before = (run_dir / LOCK_FILE).read_text()
        assert held(run_dir) is True and (run_dir / LOCK_FILE).read_text() == before  # looking changes nothing
    assert held(run_dir) is False  # its holder is gone
    enter(run_dir)  # and looking never kept it


def test_held_does_not_follow_a_link_or_wait_on_a_fifo(tmp_path):
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    with hold_run_dir(elsewhere):
        (run_dir / LOCK_FILE).symlink_to(elsewhere / LOCK_FILE)
        assert held(run_dir) is None  # another folder's lock says nothing of this one
    (run_dir / LOCK_FILE).unlink()
    os.mkfifo(run_dir / LOCK_FILE)
    assert held(run_dir) is None


def test_a_free_lock_of_a_worker_torchrun_may_restart_says_nothing(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # rank 0 of an attempt with a restart left holds it
    with hold_run_dir(run_dir):
        assert held(run_dir) is True
    assert held(run_dir) is None  # between attempts: the silence rule says whether the job is gone
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")  # the last attempt's
    enter(run_dir)
    assert held(run_dir) is False
