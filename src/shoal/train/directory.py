"""The run directory: a fresh folder per job, and the resolved job file every node and resume reads.

Both the launcher (`shoal train`, `shoal.fit`) and a worker started by torchrun or srun without
a `--run-dir` choose the folder the same way, so the rule lives here, below both.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from shoal.config import JobConfig
from shoal.errors import ConfigError
from shoal.events import EVENTS_FILE

JOB_FILE = "job.toml"


def new_run_dir(job: JobConfig, run_dir: str | Path | None) -> Path:
    """The run directory: given, from the job file, or runs/<job>-<date>-<time>; never a used one."""
    if run_dir is None and job.output.run_dir:
        run_dir = job.output.run_dir
    if run_dir is None:
        base = Path("runs") / f"{job.name}-{datetime.now():%Y%m%d-%H%M%S}"
        run_dir, number = base, 1
        while run_dir.exists():
            number += 1
            run_dir = base.with_name(f"{base.name}-{number}")
    run_dir = Path(run_dir)
    if (run_dir / EVENTS_FILE).exists():
        raise ConfigError(f"{run_dir}: already holds a run; choose another --run-dir")
    return run_dir


def write_job_file(run_dir: Path, job: JobConfig, replace: bool = True) -> Path:
    """Write the resolved job into the run directory (kept as it is when `replace` is false)."""
    path = Path(run_dir) / JOB_FILE
    if replace or not path.exists():
        path.write_text(job.to_toml())
    return path
