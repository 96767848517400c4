"""The event log at a file size limit (RLIMIT_FSIZE, set in a process of its own): a record that does not fit is
one line (`EventsFull`, naming the events file as given) and leaves no part of itself, whether its write fell
short or failed outright (EFBIG). A full disk through a whole job: tests/e2e/test_launcher_gone.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

TIMEOUT = 60
LIMIT = 3000
"""Bytes the writers' files may reach."""

WRITER = textwrap.dedent("""\
    import resource, sys
    from shoal.errors import ShoalError
    from shoal.events import EventLog, Progress
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
    log = EventLog(sys.argv[1])
    try:
        for step in range(int(sys.argv[3])):
            log.write(Progress(epoch=1, step=step, loss=0.5))
    except ShoalError as error:  # as shoal's commands end on one
        sys.exit(f"{type(error).__name__}: {error}")
""")


def write_until(run_dir: str, limit: int, records: int, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WRITER, run_dir, str(limit), str(records)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)


def raised(finished: subprocess.CompletedProcess) -> str:
    """The writer's one line: a shoal error, nothing else."""
    assert finished.returncode == 1 and finished.stderr.count("\n") == 1, finished.stderr
    return finished.stderr.rstrip("\n")


def whole_lines(path: Path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_a_record_beyond_the_limit_leaves_nothing_of_itself(tmp_path, project_env):
    (tmp_path / "run").mkdir()
    full = "EventsFull: run/events.jsonl: no room for the run's next record ("
    advice = "): free some space, then resume the run (shoal train --resume run)"
    short = raised(write_until("run", LIMIT, 10**6, tmp_path, project_env))
    assert short.startswith(full) and short.endswith(advice) and " of the record's " in short  # its write fell short
    events = tmp_path / "run" / "events.jsonl"
    records = whole_lines(events)
    assert [record["step"] for record in records] == list(range(len(records))) and events.stat().st_size < LIMIT
    # another process (a launcher recording the failure) at a limit the file is at already: its write fails
    limit = events.stat().st_size
    refused = raised(write_until("run", limit, 1, tmp_path, project_env))
    assert refused == f"{full}File too large{advice}"
    assert whole_lines(events) == records
