"""Heartbeats: the files workers write, who fell silent first, and ending only a silent shoal worker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from shoal.cluster import heartbeat
from shoal.cluster.heartbeat import HEARTBEATS, Heartbeat, clear, end_silent_peer, fell_silent

HOST = socket.gethostname()
INTERVAL = 0.05


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def write_beat(run_dir: Path, rank: int, when: float, pid: int = 1, host: str = HOST, step: int = 0) -> None:
    folder = run_dir / HEARTBEATS
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank-{rank:05d}.json").write_text(
        json.dumps({"rank": rank, "host": host, "step": step, "time": when, "pid": pid}))


def wait_for(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(INTERVAL / 5)


@pytest.fixture
def beating(tmp_path):
    """Heartbeats started by a test, closed (and their threads ended) afterwards."""
    started = []

    def start(rank: int, host: str = HOST) -> Heartbeat:
        beat = Heartbeat(tmp_path, rank, host, interval=INTERVAL)
        started.append(beat)
        return beat

    yield start
    for beat in started:
        beat.close()
        beat._thread.join(5)


# ---------------------------------------------------------------- the files


def test_heartbeat_writes_its_rank_host_step_and_pid_and_follows_the_step(tmp_path, beating):
    before = time.time()
    beat = beating(3, host="node-7")
    path = tmp_path / HEARTBEATS / "rank-00003.json"
    assert beat.path == path
    first = read(path)  # written at once, before the first interval
    assert {key: first[key] for key in ("rank", "host", "step", "pid")} == \
        {"rank": 3, "host": "node-7", "step": 0, "pid": os.getpid()}
    assert before <= first["time"] <= time.time()
    beat.beat(42)
    wait_for(lambda: read(path)["step"] == 42)
    assert read(path)["time"] > first["time"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["rank-00003.json"]  # no temporary file left


def test_heartbeat_stops_writing_when_closed(tmp_path, beating):
    beat = beating(0)
    beat.close()
    beat._thread.join(5)
    assert not beat._thread.is_alive()
    written = read(beat.path)
    beat.beat(9)
    time.sleep(3 * INTERVAL)
    assert read(beat.path) == written


def test_clear_removes_every_heartbeat_of_an_earlier_attempt(tmp_path):
    for rank in range(3):
        write_beat(tmp_path, rank, time.time())
    (tmp_path / HEARTBEATS / "rank-00001.tmp").write_text("{")  # a write cut short
    (tmp_path / HEARTBEATS / "notes.txt").write_text("kept")
    clear(tmp_path)
    assert sorted(p.name for p in (tmp_path / HEARTBEATS).iterdir()) == ["notes.txt"]
    clear(tmp_path / "never-ran")  # no heartbeats folder: nothing to do


# ---------------------------------------------------------------- who fell silent


def test_fell_silent_names_the_rank_quiet_long_before_every_other(tmp_path):
    now = 1_000_000.0
    write_beat(tmp_path, 0, now, step=50)
    write_beat(tmp_path, 1, now - 5.0, step=17)
    write_beat(tmp_path, 2, now - 0.5, step=49)
    quiet = fell_silent(tmp_path, gap=2.0)
    assert (quiet["rank"], quiet["step"], quiet["time"]) == (1, 17, now - 5.0)
    assert fell_silent(tmp_path, gap=4.5) == quiet  # 4.5 s before the next one (rank 2)
    assert fell_silent(tmp_path, gap=4.6) is None


def test_fell_silent_counts_a_gap_of_exactly_the_threshold(tmp_path):
    write_beat(tmp_path, 0, 100.0)
    write_beat(tmp_path, 1, 98.0)
    assert fell_silent(tmp_path, gap=2.0)["rank"] == 1


def test_fell_silent_names_nobody_when_the_gap_is_smaller(tmp_path):
    write_beat(tmp_path, 0, 100.0)
    write_beat(tmp_path, 1, 99.0)
    write_beat(tmp_path, 2, 10.0)
    write_beat(tmp_path, 3, 11.0)  # two ranks went quiet together: no single culprit
    assert fell_silent(tmp_path, gap=2.0) is None


def test_fell_silent_needs_two_heartbeats(tmp_path):
    assert fell_silent(tmp_path, gap=2.0) is None  # no folder
    write_beat(tmp_path, 0, 100.0)
    assert fell_silent(tmp_path, gap=2.0) is None
    (tmp_path / HEARTBEATS / "rank-00001.json").write_text('{"rank": 1, "ti')  # unreadable: skipped
    assert fell_silent(tmp_path, gap=2.0) is None


# ---------------------------------------------------------------- ending a silent peer


@pytest.fixture
def kills(monkeypatch):
    """Records os.kill calls instead of sending anything."""
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, number: sent.append((pid, number)))
    return sent


@pytest.fixture
def lookalike():
    """A harmless child (sleep) whose command line says shoal.worker; killed and reaped afterwards."""
    child = subprocess.Popen(["shoal.worker-lookalike", "30"], executable="sleep")
    wait_for(lambda: b"shoal.worker" in Path(f"/proc/{child.pid}/cmdline").read_bytes())
    yield child
    if child.poll() is None:
        child.kill()
    child.wait(5)


def silent_peer_beats(run_dir: Path, pid: int, host: str = HOST) -> None:
    """Rank 1 (`pid`) went quiet 10 s before rank 0."""
    now = time.time()
    write_beat(run_dir, 0, now, pid=os.getpid())
    write_beat(run_dir, 1, now - 10, pid=pid, host=host, step=12)


def test_end_silent_peer_refuses_a_process_that_is_not_a_shoal_worker(tmp_path, kills):
    own_command = Path("/proc/self/cmdline").read_bytes()
    if b"shoal.worker" in own_command:
        pytest.skip("this test process's own command line names shoal.worker")
    silent_peer_beats(tmp_path, pid=os.getpid())
    assert end_silent_peer(tmp_path, rank=0, host=HOST, silent_for=2.0) is None
    assert kills == []


def test_end_silent_peer_refuses_a_pid_that_no_longer_exists(tmp_path, kills):
    silent_peer_beats(tmp_path, pid=2**22 + 12345)  # above Linux's largest pid
    assert end_silent_peer(tmp_path, rank=0, host=HOST, silent_for=2.0) is None
    assert kills == []


def test_end_silent_peer_spares_its_own_rank_another_host_and_a_short_silence(tmp_path, lookalike):
    silent_peer_beats(tmp_path, pid=lookalike.pid)
    assert end_silent_peer(tmp_path, rank=1, host=HOST, silent_for=2.0) is None  # the quiet one is itself
    assert end_silent_peer(tmp_path, rank=0, host="elsewhere", silent_for=2.0) is None
    assert end_silent_peer(tmp_path, rank=0, host=HOST, silent_for=11.0) is None
    silent_peer_beats(tmp_path, pid=lookalike.pid, host="elsewhere")
    assert end_silent_peer(tmp_path, rank=0, host=HOST, silent_for=2.0) is None
    time.sleep(0.05)
    assert lookalike.poll() is None  # still running


def test_end_silent_peer_kills_a_silent_shoal_worker_on_this_host(tmp_path, lookalike):
    silent_peer_beats(tmp_path, pid=lookalike.pid)
    ended = end_silent_peer(tmp_path, rank=0, host=HOST, silent_for=2.0)
    assert (ended["rank"], ended["pid"], ended["step"]) == (1, lookalike.pid, 12)
    assert lookalike.wait(5) == -signal.SIGKILL


def test_heartbeat_module_writes_where_the_launcher_reads(tmp_path, beating):
    beating(0)
    beating(1)
    beats = sorted(p.name for p in (tmp_path / heartbeat.HEARTBEATS).glob("rank-*.json"))
    assert beats == ["rank-00000.json", "rank-00001.json"]
    assert fell_silent(tmp_path, gap=2.0) is None  # both alive
