"""The fork server: workers forked already imported, each behind a stand-in that the agent sees as the worker.

Real processes throughout: a server importing tests.support.forked, stand-ins started as torch's agent
starts its workers, and workers that exit, are killed, stop or wait for a signal (the server that cannot
start, which starts nothing: tests/unit/cluster/test_forkserver.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from shoal.cluster.environments.shoal_launcher import LAUNCHER_VARIABLE
from shoal.cluster.node import forkserver, launch
from tests.support import forked, pids

ROOT = Path(__file__).resolve().parents[3]
PYTHONPATH = f"{ROOT}{os.pathsep}{ROOT / 'src'}"  # the server imports tests.support
MODULE = forked.__name__
TIMEOUT = 30


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", PYTHONPATH)
    started = forkserver.ForkServer(MODULE)
    try:
        yield started
    finally:
        started.close()


def stand_in(server, *arguments: str, folder: Path, **options) -> subprocess.Popen:
    """A worker started as the launcher starts one: its own session, the launcher's pid in its environment."""
    environment = {**os.environ, LAUNCHER_VARIABLE: str(os.getpid()), "FORKED_MARKER": "given"}
    return subprocess.Popen([sys.executable, *server.arguments(list(arguments))], stdout=subprocess.PIPE,
                            text=True, cwd=folder, env=environment, start_new_session=True, **options)


def reported(process: subprocess.Popen) -> dict:
    return json.loads(process.stdout.readline())


def ended(pid: int) -> bool:
    return pids.ended(pid, TIMEOUT)


def test_a_worker_runs_forked_as_main_with_the_stand_ins_arguments_folder_and_environment(server, tmp_path):
    process = stand_in(server, "exit", "3", folder=tmp_path)
    worker = reported(process)
    assert process.wait(timeout=TIMEOUT) == 3  # its status, through the stand-in
    assert worker["name"] == "__main__" and worker["arguments"] == ["exit", "3"]
    assert worker["folder"] == str(tmp_path) and worker["marker"] == "given"
    # forked from the server, not started by the stand-in; the server, which ends with the launcher, is its launcher
    assert worker["pid"] != process.pid and worker["parent"] == server.process.pid
    assert worker["under_launcher"] and not worker["hangup_ignored"]


def test_a_worker_killed_by_a_signal_leaves_its_stand_in_killed_by_the_same(server, tmp_path):
    process = stand_in(server, "kill", folder=tmp_path)
    reported(process)
    assert process.wait(timeout=TIMEOUT) == -signal.SIGKILL


def test_the_stand_ins_signals_reach_the_worker(server, tmp_path):
    process = stand_in(server, "term", folder=tmp_path)
    reported(process)  # its handler is in place
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=TIMEOUT) == 5


def test_a_signal_ignored_by_the_stand_in_is_ignored_by_the_worker(server, tmp_path):
    process = stand_in(server, "exit", "0", folder=tmp_path,
                       preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))  # as under nohup
    assert reported(process)["hangup_ignored"]
    assert process.wait(timeout=TIMEOUT) == 0


def test_a_stopped_worker_goes_when_its_stand_in_is_killed(server, tmp_path):
    """The agent's SIGKILL after its grace time reaches the stand-in only; the server kills the worker."""
    process = stand_in(server, "stop", folder=tmp_path)
    worker = reported(process)["pid"]
    while psutil.Process(worker).status() != psutil.STATUS_STOPPED:
        time.sleep(0.01)
    process.kill()
    process.wait(timeout=TIMEOUT)
    assert ended(worker), "the stopped worker outlived its stand-in"


def test_closing_the_server_kills_its_workers_and_removes_its_folder(server, tmp_path):
    process = stand_in(server, "sleep", folder=tmp_path)
    worker = reported(process)["pid"]
    server.close()
    assert ended(worker) and process.wait(timeout=TIMEOUT) == -signal.SIGKILL
    assert not os.path.exists(server.folder)


def test_without_a_server_the_stand_in_is_the_worker(tmp_path):
    environment = {**os.environ, "PYTHONPATH": PYTHONPATH}
    process = subprocess.Popen([sys.executable, "-m", forkserver.STAND_IN, str(tmp_path / "no-server"), MODULE,
                                "exit", "4"], stdout=subprocess.PIPE, text=True, env=environment)
    worker = reported(process)
    assert process.wait(timeout=TIMEOUT) == 4
    assert worker["pid"] == process.pid and worker["name"] == "__main__"


def test_the_server_ends_with_its_launcher_and_its_workers_as_orphans(tmp_path, project_env):
    """A launcher killed outright: its server sees it gone at once, and the worker, its parent gone, stops
    itself (the stand-in waits for it)."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, MODULE, str(tmp_path)], stdout=subprocess.PIPE,
                                text=True, env={**project_env, "PYTHONPATH": PYTHONPATH})
    try:
        server, folder = launcher.stdout.readline().split()
        worker = json.loads(launcher.stdout.readline())["pid"]
        launcher.kill()
        launcher.wait(timeout=TIMEOUT)
        assert ended(int(server)) and ended(worker), "the server or its worker outlived the launcher"
        assert not os.path.exists(folder)
    finally:
        launcher.kill()


# a launcher: starts a server, one worker that sleeps behind its stand-in, and says their pids
LAUNCHER = """
import os, subprocess, sys
from shoal.cluster.node import forkserver, launch
server = forkserver.start(sys.argv[1])
print(server.process.pid, server.folder, flush=True)
os.environ["SHOAL_LAUNCHER_PID"] = str(os.getpid())
stand_in = subprocess.Popen([sys.executable, *server.arguments(["sleep"])], cwd=sys.argv[2], start_new_session=True)
stand_in.wait()
"""


def test_a_request_that_is_not_a_stand_ins_starts_nothing_and_the_server_goes_on(server, tmp_path):
    for garbage in (b"", b"\x00" * 8, b"\x00\x00\x00\x00\x00\x00\x00\x02{}"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(server.path)
            connection.sendall(garbage)
            connection.shutdown(socket.SHUT_WR)
            assert connection.recv(8) == b""  # closed without a pid
    process = stand_in(server, "exit", "0", folder=tmp_path)
    assert reported(process)["parent"] == server.process.pid and process.wait(timeout=TIMEOUT) == 0
    assert psutil.Process(server.process.pid).children() == []


def test_the_server_is_not_stopped_by_the_signals_meant_for_the_jobs_processes(server, tmp_path):
    """scancel or a terminal signals every process of the job: the workers stop as they would, the server
    (told by its launcher) stays."""
    first = stand_in(server, "exit", "0", folder=tmp_path)
    assert reported(first)["parent"] == server.process.pid and first.wait(timeout=TIMEOUT) == 0  # it serves
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        server.process.send_signal(number)
    process = stand_in(server, "exit", "0", folder=tmp_path)
    assert reported(process)["parent"] == server.process.pid and process.wait(timeout=TIMEOUT) == 0


def test_a_signal_reaches_the_workers_own_children_as_torchs_agent_sends_it_to_a_group(server, tmp_path):
    process = stand_in(server, "family", folder=tmp_path)
    worker = reported(process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=TIMEOUT) == -signal.SIGTERM
    assert ended(worker["pid"]) and ended(worker["child"]), "the worker's child missed the signal"


def test_an_uncaught_error_ends_the_worker_as_the_interpreter_would(server, tmp_path):
    process = stand_in(server, "raise", folder=tmp_path, stderr=subprocess.PIPE)
    reported(process)
    assert process.wait(timeout=TIMEOUT) == 1
    assert process.stdout.read().strip() == "exit functions ran"  # os._exit alone would skip them
    assert "RuntimeError: raised on purpose" in process.stderr.read()
    interrupted = stand_in(server, "interrupt", folder=tmp_path, stderr=subprocess.DEVNULL)
    reported(interrupted)
    assert interrupted.wait(timeout=TIMEOUT) == -signal.SIGINT


def test_the_launchers_stop_leaves_the_server_alone(server, tmp_path, monkeypatch):
    """shoal.cluster.node.launch.stop_workers signals the launcher's children that run the worker module: the
    stand-ins, whose workers get the signal, and not the server, whose command line names the module too."""
    monkeypatch.setattr(launch, "WORKER_MODULE", MODULE)
    process = stand_in(server, "term", folder=tmp_path)
    reported(process)
    assert launch.stop_workers(signal.SIGTERM) == 1
    assert process.wait(timeout=TIMEOUT) == 5 and server.process.poll() is None


def test_an_exit_status_is_kept_as_the_system_keeps_it(server, tmp_path):
    process = stand_in(server, "exit", "-1", folder=tmp_path)
    reported(process)
    assert process.wait(timeout=TIMEOUT) == 255  # as `python -m` would end: not "killed by SIGHUP"


def test_the_server_says_when_it_has_imported_or_given_up(server):
    assert server.wait_ready(timeout=TIMEOUT)
    failing = forkserver.ForkServer("tests.support.no_such_module")  # its import fails: the server ends
    try:
        assert not failing.wait_ready(timeout=TIMEOUT)
    finally:
        failing.close()
    assert not os.path.exists(failing.folder)
