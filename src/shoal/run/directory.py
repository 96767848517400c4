"""The run directory: a fresh folder per job, and the resolved job file every node and resume reads.

Both the launcher (`shoal train`, `shoal.fit`) and a worker started by torchrun or srun without
a `--run-dir` choose the folder the same way, so the rule lives here, below both.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from shoal.config import JobConfig
from shoal.durable import write_text_durably
from shoal.errors import ConfigError
from shoal.events import EVENTS_FILE
from shoal.safe_files import refuse_link

JOB_FILE = "job.toml"
MARKER = "# written by shoal: the resolved job of this run"
"""The resolved job file's first line (a TOML comment): shoal replaces only a job file that opens with it."""


def new_run_dir(job: JobConfig, run_dir: str | Path | None, joining: bool = False) -> Path:
    """The run directory: given, from the job file, or runs/<job>-<date>-<time>; never a used one, except that a
    machine `joining` a job of several may find the first machine's run in a folder they share (the first
    machine, which writes the events, checks it once the machines have met)."""
    if run_dir is None and job.output.run_dir:
        run_dir = job.output.run_dir
    check_name(job.name)
    if run_dir is None:
        base = Path("runs") / f"{job.name}-{datetime.now():%Y%m%d-%H%M%S}"
        run_dir, number = base, 1
        while run_dir.exists():
            number += 1
            run_dir = base.with_name(f"{base.name}-{number}")
    run_dir = Path(run_dir)
    check_new_run_dir(run_dir, joining)
    return run_dir


def check_name(name: str) -> None:
    """The job's name names its folder under runs/: one plain path component, never a way out of runs/."""
    if not name or name in (".", "..") or any(mark in name for mark in ("/", "\\", "\0")):
        raise ConfigError(f"name: {name!r} is not a plain name (no '/', '\\', or '..' alone): it names the run "
                          "directory runs/<name>-<date>-<time>")


def check_new_run_dir(run_dir: Path, joining: bool = False) -> None:
    """A new run may go here: a folder (or a path that can become one) holding no run (unless `joining`: see
    new_run_dir) and no user's job file."""
    for folder in (run_dir, *run_dir.parents):
        if folder.exists() and not folder.is_dir():
            where = "is a file, not a folder" if folder == run_dir else f"cannot be a folder: {folder} is a file"
            raise ConfigError(f"{run_dir}: {where}; choose another --run-dir")
    for name in (EVENTS_FILE, JOB_FILE):
        refuse_link(run_dir / name)
    if (run_dir / EVENTS_FILE).exists() and not joining:
        raise held_run(run_dir)
    if not replaceable(run_dir / JOB_FILE):
        raise _not_ours(run_dir / JOB_FILE)


def held_run(run_dir: Path) -> ConfigError:
    return ConfigError(f"{run_dir}: already holds a run; choose another --run-dir")


def write_job_file(run_dir: Path, job: JobConfig, replace: bool = True) -> Path:
    """Write the resolved job into the run directory, whole or not at all (kept as it is when `replace` is false).

    A job file that shoal did not write (the user's own, in a folder chosen as the run directory)
    is never replaced.
    """
    path = Path(run_dir) / JOB_FILE
    refuse_link(path)
    if path.exists() and not replace:
        return path
    if not replaceable(path):
        raise _not_ours(path)
    write_text_durably(path, f"{MARKER}\n{job.to_toml()}")
    return path


def replaceable(path: Path) -> bool:
    """Whether shoal may write `path`: absent, written by shoal, or beside the events of a run
    (a job file from a shoal before the marker, already the run's own)."""
    if not path.exists():
        return True
    if (path.parent / EVENTS_FILE).is_file():
        return True
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.readline().rstrip("\r\n") == MARKER
    except (OSError, UnicodeDecodeError):
        return False


def _not_ours(path: Path) -> ConfigError:
    return ConfigError(f"{path}: not written by shoal (its first line is not {MARKER!r}), so shoal will not "
                       "replace it; choose another --run-dir")
