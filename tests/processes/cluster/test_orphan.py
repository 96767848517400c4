"""A process whose parent dies ends itself (the worker's guard against a SIGKILLed launcher): real parents,
really killed (which parent a process watches: tests/unit/cluster/test_orphan.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from shoal.cluster.environments.shoal_launcher import LAUNCHER_VARIABLE
from shoal.cluster.orphan import ORPHAN_EXIT
from tests.support.pids import ended, unused_pid

CHILD = ("import os, sys, time; from shoal.cluster.environments import detect; "
         "from shoal.cluster.orphan import end_with_parent; launcher = detect(os.environ); "
         "end_with_parent(0.1, launcher=launcher.launcher_pid() if launcher else None); "
         "print('watching', flush=True); time.sleep(60)")
PARENT = ("import os, subprocess, sys; os.environ['SHOAL_LAUNCHER_PID'] = str(os.getpid()); "
          "child = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=subprocess.PIPE, text=True); "
          "print(child.pid, flush=True); print(child.stdout.readline().strip(), flush=True); child.wait()")


def test_an_orphan_stops_within_a_second(project_env):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True,
                              env=project_env)
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "watching"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert ended(child, timeout=5), "the orphan went on running"
    finally:
        parent.kill()
        parent.stdout.close()


def test_a_worker_whose_launcher_died_before_it_started_stops_at_once(project_env):
    dead = unused_pid()
    finished = subprocess.run([sys.executable, "-c", CHILD], env={**project_env, LAUNCHER_VARIABLE: str(dead)},
                              capture_output=True, text=True, timeout=30)
    assert finished.returncode == ORPHAN_EXIT and "is gone; stopping" in finished.stderr


@pytest.mark.parametrize("launcher", ["parent", "another live process"])
def test_a_process_whose_parent_lives_keeps_running(project_env, launcher):
    """Under torchrun the variable may name a live shoal process that is not the parent: no matter."""
    code = CHILD.replace("time.sleep(60)", "time.sleep(0.5); raise SystemExit(3)")
    env = dict(project_env)
    if launcher != "parent":
        env[LAUNCHER_VARIABLE] = "1"
    finished = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=30)
    assert finished.returncode == 3 != ORPHAN_EXIT
