"""Machines of different speeds, as `shoal plan --machines` lists them.

A cluster put together from what is at hand mixes machines: a plan that assumes every one is the
profile's machine prices an epoch the slowest one stretches. `--machines` lists classes of machines in
rank order, each a count and a speed against the profile's machine: a number (`2x1.0,1x0.5`), or a
profile saved on such a machine by `shoal plan --save-profile` (`2xfast.json,1xslow.json`), whose step
for the job's model at its batch size gives the speed. Reading a profile runs no code.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path

from shoal.errors import ConfigError
from shoal.plan.profile import Compute, load_profile

MAX_MACHINES = 10_000
CLASS = re.compile(r"\s*([0-9]+)\s*x(.+)")
SYNTAX = "COUNTxSPEED or COUNTxPROFILE, like 2x1.0,1x0.5 or 2xfast.json,1xslow.json"


@dataclass(frozen=True)
class MachineClass:
    """`count` machines alike: their speed given, or measured into a saved profile's compute."""

    count: int
    speed: float | None = None
    """Their workers step this many times as fast as the profile's machine's (0.5: half as fast)."""
    path: Path | None = None
    compute: Compute | None = None
    """Read from the profile at `path`: their speed is the plan's step over this one, at the job's batch size."""


def parse_machines(text: str) -> list[MachineClass]:
    """`--machines`'s classes, their profiles read (a bad one is one line naming it)."""
    classes = [machine_class(part) for part in text.split(",")]
    total = sum(machine.count for machine in classes)
    if total > MAX_MACHINES:
        raise ConfigError(f"--machines: at most {MAX_MACHINES:,} machines, got {total:,}")
    return classes


def machine_class(part: str) -> MachineClass:
    match = CLASS.fullmatch(part)
    if match is None or int(match.group(1)) < 1:
        raise ConfigError(f"--machines: expected {SYNTAX}, got {part.strip()!r}")
    count, what = int(match.group(1)), match.group(2).strip()
    try:
        speed = float(what)
    except ValueError:
        return MachineClass(count, path=Path(what), compute=saved_compute(Path(what)))
    if not (math.isfinite(speed) and speed > 0):
        raise ConfigError(f"--machines: {part.strip()!r}: a speed must be a number > 0 (1.0: the profile's machine)")
    return MachineClass(count, speed=speed)


def saved_compute(path: Path) -> Compute:
    compute = load_profile(path).compute
    if compute is None:
        raise ConfigError(f"--machines: {path}: no compute in it (save one with shoal plan JOB --save-profile on "
                          "such a machine)")
    return compute


def check_models(classes: list[MachineClass], model: str) -> None:
    """Every class profile measured this job's model (`model`: its description digest)."""
    for machine in classes:
        if machine.compute is not None and machine.compute.model != model:
            raise ConfigError(f"--machines: {machine.path}: compute.model: measured on another model than this "
                              "job's (save one with shoal plan JOB --save-profile on such a machine)")


def machine_speeds(classes: list[MachineClass], compute: Compute, batch: int) -> tuple[float, ...]:
    """Each machine's speed in rank order; a class profile's is `compute`'s step at `batch` over its own."""
    speeds: list[float] = []
    for machine in classes:
        speed = machine.speed
        if machine.compute is not None:
            own = machine.compute.step(batch)
            if not own > 0:
                raise ConfigError(f"--machines: {machine.path}: compute.step_seconds: no time for a step at "
                                  f"batch {batch}")
            speed = compute.step(batch) / own
        speeds += [speed] * machine.count
    return tuple(speeds)


def machine_counts(classes: list[MachineClass]) -> list[int]:
    """The node counts a plan of listed machines shows: 1, 2, 4... up to all of them, and where each class
    ends (whether the next class's machines pay)."""
    total = sum(machine.count for machine in classes)
    doubling = {2**power for power in range(total.bit_length()) if 2**power <= total}
    return sorted(doubling | set(itertools.accumulate(machine.count for machine in classes)))
