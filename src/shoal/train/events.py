"""The run's event stream: one JSON object per line in RUN_DIR/events.jsonl.

The progress display, `shoal status`, reports and benchmarks all read this one stream, so
each record is flushed as it is written: a reader never waits for the job to end.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"


class EventLog:
    """Appends records `{"event": kind, "time": unix seconds, ...}` to a run's events file."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / EVENTS_FILE
        self._handle = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()  # the background validation writes too

    def write(self, event: str, **fields: Any) -> dict:
        record = {"event": event, "time": round(time.time(), 3), **fields}
        line = json.dumps(record, default=_plain) + "\n"
        with self._lock:
            self._handle.write(line)
            self._handle.flush()
            os.fsync(self._handle.fileno())
        return record

    def close(self) -> None:
        self._handle.close()


def append_event(run_dir: str | Path, event: str, **fields: Any) -> dict:
    """Append one record to an existing run's events (the launcher's failure records)."""
    log = EventLog(run_dir)
    try:
        return log.write(event, **fields)
    finally:
        log.close()


def _plain(value: Any) -> Any:
    """numpy scalars and other stragglers as plain JSON values."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def read_events(run_dir: str | Path) -> Iterator[dict]:
    """Records of a run, oldest first; a half-written last line (a live job) is skipped."""
    path = Path(run_dir) / EVENTS_FILE
    if not path.exists():
        return
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
