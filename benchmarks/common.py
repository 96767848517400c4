"""What every benchmark shares: the machine's description, timing runs of shoal, dated results."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
from datetime import date
from pathlib import Path

from shoal.bench.machine import describe
from shoal.bench.machine import machine_line as describe_line
from shoal.events import History, read_history

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
WORK = ROOT / "benchmarks" / "work"  # generated data and runs; ignored by git


def require_cluster(script: str, hosts: int, dilation: int = 1) -> None:
    """Exit with the reason when an emulated cluster of `hosts` (dilated by `dilation`) cannot be built here; else
    have SIGTERM (as `timeout` sends) end the script as an exception would, so that its `with` blocks close what
    they built (namespaces, cgroups, keepers)."""
    from tests.cluster.hosts import missing_requirements

    reason = missing_requirements(hosts, dilation)
    if reason:
        sys.exit(f"{script}: {reason}")
    signal.signal(signal.SIGTERM, lambda number, _frame: sys.exit(128 + number))


def machine() -> dict:
    info = describe()
    info.pop("host")
    return info


def machine_line(info: dict | None = None) -> str:
    return describe_line(info or machine())


def hardware_tag(info: dict | None = None) -> str:
    info = info or machine()
    return f"{info['cores']}core-cpu"


def write_result(name: str, markdown: str, data: dict, replacing: Path | None = None) -> Path:
    """benchmarks/results/<date>-<hardware>-<name>.md plus the raw numbers as JSON; a later run of the same day
    writes <name>-2, -3, ... beside it, so no committed result is overwritten. `replacing`: this run's own
    earlier result (a script that writes as it goes)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    if replacing is not None:
        return write_stem(replacing.stem, markdown, data)
    return write_stem(free_stem(f"{date.today().isoformat()}-{hardware_tag()}-{name}"), markdown, data)


def free_stem(stem: str) -> str:
    """`stem`, or `stem-2`, `stem-3`, ...: the first that no result in RESULTS has."""
    taken = {path.stem for path in RESULTS.glob(f"{stem}*")}
    number = 1
    while (candidate := stem if number == 1 else f"{stem}-{number}") in taken:
        number += 1
    return candidate


def write_stem(stem: str, markdown: str, data: dict) -> Path:
    path = RESULTS / f"{stem}.md"
    path.write_text(markdown)
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=1))
    return path


def shoal_train(job: Path, run_dir: Path, *arguments: str) -> History:
    """Run `shoal train` and return its events."""
    command = [sys.executable, "-m", "shoal", "train", str(job), "--run-dir", str(run_dir), *arguments,
               "--set", "output.progress='none'"]
    subprocess.run(command, check=True, cwd=ROOT)
    return read_history(run_dir)


def epoch_seconds(history: History, skip_first: bool = True) -> list[float]:
    """Seconds of each epoch's training (evaluation excluded), the first dropped as warm-up."""
    seconds = [epoch.seconds for epoch in history.epochs]
    return seconds[1:] if skip_first and len(seconds) > 1 else seconds


def median(values: list[float]) -> float:
    return statistics.median(values)


def later_median(seconds: list[float]) -> float:
    """The median of the later half of a run's epochs: the first ones overlap the start-up's tail (longest on
    dilated hosts, which start D times slower)."""
    return statistics.median(seconds[len(seconds) // 2:])
