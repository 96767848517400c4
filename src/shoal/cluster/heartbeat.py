"""Heartbeats: each worker notes that it is alive, and its step, in a small file every second.

When a collective times out, the rank that reports the error is rarely the one at fault: the
one that stopped answering is. A background thread writes the heartbeat, so a worker blocked
in a collective (waiting, alive) keeps beating while a stopped or wedged one falls silent; the
launcher names the rank whose heartbeat went quiet first.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

HEARTBEATS = "heartbeats"
HEARTBEAT_SECONDS = 1.0


class Heartbeat:
    """Rewrites RUN_DIR/heartbeats/rank-R.json every `interval` seconds from a daemon thread."""

    def __init__(self, run_dir: Path, rank: int, host: str, interval: float = HEARTBEAT_SECONDS):
        folder = Path(run_dir) / HEARTBEATS
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"rank-{rank:05d}.json"
        self.rank, self.host, self.interval = rank, host, interval
        self.step = 0
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._run, name="shoal-heartbeat", daemon=True)
        self._thread.start()

    def beat(self, step: int) -> None:
        """Note the step reached (cheap: the thread writes it)."""
        self.step = step

    def _write(self) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"rank": self.rank, "host": self.host, "step": self.step,
                                         "time": time.time(), "pid": os.getpid()}))
        os.replace(temporary, self.path)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._write()
            except OSError:  # a full or vanished disk must not kill training
                pass

    def close(self) -> None:
        self._stop.set()

    @property
    def beating(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()


def end_silent_peer(run_dir: Path, rank: int, host: str, silent_for: float) -> dict | None:
    """After a collective timed out: kill the quietest worker if it is on this host and silent.

    A stopped or wedged worker ignores the launcher's SIGTERM, and the launcher would wait
    before escalating; ending it here lets the job fail at once. Returns its heartbeat.
    """
    quiet = fell_silent(run_dir, silent_for)
    if quiet is None or quiet["rank"] == rank or quiet["host"] != host:
        return None
    try:  # only a shoal worker: a pid from an old heartbeat may belong to anything by now
        with open(f"/proc/{quiet['pid']}/cmdline", "rb") as handle:
            if b"shoal.worker" not in handle.read():
                return None
        os.kill(quiet["pid"], signal.SIGKILL)
    except OSError:
        return None
    return quiet


def clear(run_dir: Path) -> None:
    """Forget the heartbeats of an earlier attempt, which would blame the wrong rank."""
    for path in (Path(run_dir) / HEARTBEATS).glob("rank-*"):
        path.unlink(missing_ok=True)


def fell_silent(run_dir: Path, gap: float) -> dict | None:
    """The heartbeat of a rank that went quiet `gap` seconds or more before every other one did.

    Compared with the other ranks rather than the clock, so it still names the culprit after
    all workers have ended.
    """
    beats = []
    for path in (Path(run_dir) / HEARTBEATS).glob("rank-*.json"):
        try:
            beats.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if len(beats) < 2:
        return None
    beats.sort(key=lambda beat: beat["time"])
    quiet, others = beats[0], beats[1:]
    return quiet if min(beat["time"] for beat in others) - quiet["time"] >= gap else None
