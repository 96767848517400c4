"""The launcher's temporary folders carry its pid: those of ended launchers are swept, never a live one's,
another program's, or what a link points at."""

from __future__ import annotations

import os

from shoal.cluster import scratch
from shoal.data.leftovers import owned_name
from tests.support.pids import unused_pid


def test_only_the_folders_of_ended_launchers_are_swept(tmp_path):
    ended = unused_pid()  # as an ended launcher's: no process has it
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    dead = [tmp_path / owned_name(scratch.LOGS, ended), tmp_path / owned_name(scratch.SERVER, ended)]
    for folder in dead:
        folder.mkdir()
        (folder / "log").write_text("left by a killed launcher")
        (folder / "link").symlink_to(victim)
    live = tmp_path / owned_name(scratch.LOGS, os.getppid())
    others = [live, tmp_path / f"{scratch.LOGS}.abcdefgh", tmp_path / "torchelastic_x"]
    for folder in others:
        folder.mkdir()
    link = tmp_path / owned_name(scratch.LOGS, ended)
    link.symlink_to(victim)
    assert sorted(scratch.sweep(str(tmp_path))) == sorted(map(str, dead))
    assert all(folder.is_dir() for folder in others) and link.is_symlink()
    assert (victim / "keep").read_text() == "precious"


def test_a_new_folder_is_owned_by_this_process(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    made = scratch.make(scratch.LOGS)
    assert scratch.owner(os.path.basename(made)) == os.getpid() and os.stat(made).st_mode & 0o777 == 0o700
    assert scratch.sweep() == [] and os.path.isdir(made)


def test_fit_and_predict_folders_of_ended_processes_go_when_the_next_one_is_made(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    ended = unused_pid()  # as an ended launcher's: no process has it
    left = [tmp_path / owned_name(prefix, ended) for prefix in (scratch.DATA, scratch.PREDICT)]
    for folder in left:
        folder.mkdir()
    made = scratch.make(scratch.PREDICT, sweep_first=True)
    assert not any(folder.exists() for folder in left) and os.path.isdir(made)


def test_a_maker_known_to_have_ended_is_swept_before_the_kernel_says_so(tmp_path):
    """The fork server sees its launcher's pipe close before the kernel shows the launcher ended."""
    mine = tmp_path / owned_name(scratch.LOGS)
    mine.mkdir()
    assert scratch.sweep(str(tmp_path)) == []
    assert scratch.sweep(str(tmp_path), ended=(os.getpid(),)) == [str(mine)] and not mine.exists()
