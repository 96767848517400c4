"""The watch that keeps tests/unit free of processes hears what would start one, and puts multiprocessing back."""

from __future__ import annotations

import multiprocessing.process
import sys

from tests.support.no_processes import watch


def test_a_subprocess_or_a_fork_is_heard_while_watched():
    with watch() as started:
        sys.audit("subprocess.Popen", "/bin/true", ["true"], None, None)  # the event only: nothing starts
        sys.audit("os.fork")
        sys.audit("os.listdir", ".")  # not a process
    assert started == ["subprocess.Popen ('/bin/true', ['true'])", "os.fork ()"]


def test_multiprocessing_is_watched_at_its_start_and_put_back_after():
    original = multiprocessing.process.BaseProcess.start
    with watch():
        assert multiprocessing.process.BaseProcess.start is not original
    assert multiprocessing.process.BaseProcess.start is original
