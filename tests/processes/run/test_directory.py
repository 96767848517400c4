"""The run directory is held by one job at a time: a second process holding it, or killed while holding it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from shoal.run.lock import LOCK_FILE, hold_run_dir
from tests.unit.run.test_directory import enter, one_line_error

# ---------------------------------------------------------------- one job at a time

HOLDER = textwrap.dedent("""\
    import select, sys
    from shoal.run.lock import hold_run_dir
    with hold_run_dir(sys.argv[1]):
        print("held", flush=True)
        select.select([sys.stdin], [], [], 60)  # until the test closes stdin (or a minute)
""")


def start_holder(run_dir: Path, project_env: dict) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=project_env)
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_second_job_is_refused_at_once_while_the_first_holds_the_run_dir(tmp_path, project_env):
    run_dir = tmp_path / "run"
    holder = start_holder(run_dir, project_env)
    try:
        began = time.monotonic()
        message = one_line_error(enter, run_dir)
        assert time.monotonic() - began < 5  # refused, not waiting for the holder
        assert message == (f"{run_dir}: in use by another shoal job (pid {holder.pid} on {socket.gethostname()}); "
                           "wait for it or choose another --run-dir")
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    with hold_run_dir(run_dir):  # the holder is done: the run directory is free
        assert (run_dir / LOCK_FILE).read_text() == f"{os.getpid()} {socket.gethostname()}\n"


def test_a_job_killed_while_holding_the_run_dir_does_not_keep_it(tmp_path, project_env):
    run_dir = tmp_path / "run"
    holder = start_holder(run_dir, project_env)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    holder.stdin.close()
    with hold_run_dir(run_dir) as held:
        assert held == run_dir
        assert (run_dir / LOCK_FILE).read_text() == f"{os.getpid()} {socket.gethostname()}\n"
        # and while this process holds it, another job is refused
        assert "in use by another shoal job" in one_line_error(enter, run_dir)
