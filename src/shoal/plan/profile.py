"""What the planner knows about the machines: a profile of measured (or described) costs, kept as JSON.

Calibration measures a machine's compute for one model and the network between hosts once;
the profile file lets later plans reuse both without probing again. It is data: reading it runs
no code, and a bad file is one line naming the file and the key at fault.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from shoal.durable import write_bytes_durably
from shoal.errors import ConfigError
from shoal.plan.costs import Link

FORMAT = 3
# 2 priced a measured link through its points (the line only beyond them): still read, and priced so; 1 kept one
# loop factor for every batch size
INTERPOLATED = 2


@dataclass
class Compute:
    """One worker's costs for one model with `threads` threads, measured on one machine."""

    model: str
    """The model's description digest: a profile's compute serves only the model it was measured on."""
    parameters: int
    threads: int
    step_seconds: dict[int, float]
    """Batch size -> seconds of one local step: batch slicing, forward, backward and the optimizer's step."""
    update_seconds: float
    """The optimizer's step over every parameter."""
    copy_seconds_per_byte: float
    """Copying a flat buffer (packing a message, putting a reply in place)."""
    evaluate_seconds_per_row: float
    """Forward pass only, at evaluation's batch size."""
    load_rows_per_second: float
    """One worker reading its share from the dataset store into memory."""
    startup_seconds: float
    """From `shoal train` to the first step of a one-worker job, less its data load."""
    step_spread: float = 0.0
    """How much later than the mean the slowest of two workers finishes a step (seconds): what a
    collective waits for at every step, beside the transfer itself."""
    startup_per_node: float = 0.0
    """Start-up added by every node (0 for shoal, whose nodes start in parallel; a described cluster whose
    orchestration starts nodes one by one sets it)."""
    loop_factors: dict[int, float] = field(default_factory=dict)
    """Batch size -> a real training loop's step over the probed one at that batch (the loop's own work per
    step: its hooks, its batches' gathering from the whole share), each measured with a short real job.
    Not one number: at 784-256-10 the loop ran 0.88 of the probe at batch 128 and 1.0 at batch 1024."""
    resume_seconds: dict[float, float] = field(default_factory=dict)
    """Seconds idle -> what the next step costs beyond a step amid back-to-back ones: a worker that waited on
    the network finds its caches cold (on a 2-core VM a 784-40-10 step of 0.83 ms took 0.90 ms after
    1 ms idle, 1.2 ms after 16 ms and 1.7 ms after 200 ms). Rising with the wait, none when not measured."""
    pace_range: float = 1.0
    """The slowest timing of the job's step over the fastest while this compute was measured (the probe's
    rounds and its timings around the real loop; across the profiles when several are combined): 1 on a
    steady machine. A plan holds no steadier than the machine: on a 2-core VM three calibrations' real
    steps at batch 128 read 0.54, 0.59 and 1.15 ms within an hour."""

    def step(self, batch: int) -> float:
        """Seconds of a step at `batch` rows, interpolated between the measured batch sizes (linear beyond)."""
        sizes = sorted(self.step_seconds)
        if len(sizes) == 1:
            return self.step_seconds[sizes[0]] * batch / sizes[0] * self.loop_factor(batch)
        index = min(max(bisect.bisect_left(sizes, batch), 1), len(sizes) - 1)
        low, high = sizes[index - 1], sizes[index]
        slope = (self.step_seconds[high] - self.step_seconds[low]) / (high - low)
        return max(self.step_seconds[low] + slope * (batch - low), 0.0) * self.loop_factor(batch)

    def loop_factor(self, batch: int) -> float:
        """The loop factor at `batch`: measured there, else interpolated in log batch size between the nearest
        measured ones (the nearest one's beyond them); 1 when none was measured."""
        return _in_log_steps(self.loop_factors, batch) if self.loop_factors else 1.0

    def resume(self, wait: float) -> float:
        """The extra seconds of a step after `wait` seconds idle: interpolated in log wait between the measured
        waits, in proportion to the wait below the shortest, the longest one's beyond."""
        if not self.resume_seconds or wait <= 0:
            return 0.0
        return _in_log_steps(self.resume_seconds, wait) * min(wait / min(self.resume_seconds), 1.0)


def slowest_over_fastest(seconds: Iterable[float]) -> float:
    """How far timings of one thing moved: the largest over the smallest (1 for one timing, or none)."""
    found = [value for value in seconds if value > 0]
    return max(found) / min(found) if found else 1.0


def _in_log_steps(table: dict, at: float) -> float:
    """`table`'s value at `at`, interpolated in log key between its nearest keys; the end key's beyond them."""
    keys = sorted(table)
    if at <= keys[0] or at >= keys[-1]:
        return table[keys[0] if at <= keys[0] else keys[-1]]
    index = bisect.bisect_left(keys, at)
    low, high = keys[index - 1], keys[index]
    weight = math.log(at / low) / math.log(high / low)
    return table[low] + weight * (table[high] - table[low])


@dataclass
class Network:
    """The links between workers: `across` machines and `inside` one machine (loopback)."""

    across: Link
    inside: Link
    source: str
    """How it was known: measured between which hosts, or described by the user."""
    message_across: Link | None = None
    """A point-to-point message across machines (a parameter server's), when measured apart from the ring."""
    slowest_host: float = 1.0
    """The same compute burst's time on the slowest probed host over the first host's, timed side by side:
    a cluster's epoch goes at its slowest worker's pace, and compute is measured where `shoal plan` runs,
    which is meant to be the first host (or one like it)."""

    def message(self) -> Link:
        return self.message_across or self.across

    @property
    def interpolated(self) -> bool:
        """Whether a link is priced through its measured points (a format-2 profile's), not by its line."""
        return any(link is not None and link.interpolated for link in (self.across, self.inside, self.message_across))


@dataclass
class Profile:
    machine: dict = field(default_factory=dict)
    compute: Compute | None = None
    network: Network | None = None
    format: int = FORMAT

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1) + "\n"

    def save(self, path: Path) -> None:
        """Whole or not at all: a later plan never reads half a profile."""
        write_bytes_durably(path, self.to_json().encode())


def load_profile(path: Path) -> Profile:
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such profile") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: not a shoal profile ({error})") from None
    return profile_from(raw, path)


def profile_from(raw, path: Path) -> Profile:
    """A profile from its JSON data as read (`path` names where it came from in errors)."""
    found = raw.get("format") if isinstance(raw, dict) else None
    if isinstance(found, bool) or found not in (FORMAT, INTERPOLATED):
        raise ConfigError(f"{path}: format: expected {FORMAT} (or {INTERPOLATED}), got {found!r} (a profile written "
                          "by this shoal's plan --save-profile; an older one is measured again without --profile)")
    return Profile(machine=_section(path, raw, "machine", dict), compute=_compute(path, raw.get("compute")),
                   network=_network(path, raw.get("network"), interpolated=found == INTERPOLATED))


def _section(path: Path, raw: dict, key: str, kind: type):
    value = raw.get(key, kind())
    if not isinstance(value, kind):
        raise ConfigError(f"{path}: {key}: expected {kind.__name__}")
    return value


def _number(path: Path, key: str, value, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
        raise ConfigError(f"{path}: {key}: expected a number >= {minimum}, got {value!r}")
    return float(value)


def _link(path: Path, key: str, raw, interpolated: bool = False) -> Link:
    """A link; `interpolated`: read from a format-2 profile, priced through its measured points as it was then."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {key}: expected {{latency, bandwidth}}")
    bandwidth = _number(path, f"{key}.bandwidth", raw.get("bandwidth"), minimum=1.0)
    points = raw.get("points", [])
    if not isinstance(points, list) or not all(isinstance(point, list) and len(point) == 2 for point in points):
        raise ConfigError(f"{path}: {key}.points: expected [[bytes, seconds], ...]")
    measured = tuple(sorted((int(_number(path, f"{key}.points", size)), _number(path, f"{key}.points", seconds))
                            for size, seconds in points))
    through = raw.get("interpolated", interpolated)
    if not isinstance(through, bool):
        raise ConfigError(f"{path}: {key}.interpolated: expected true or false, got {through!r}")
    return Link(latency=_number(path, f"{key}.latency", raw.get("latency")), bandwidth=bandwidth, points=measured,
                interpolated=through and bool(measured))


def _network(path: Path, raw, interpolated: bool = False) -> Network | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: network: expected a table")
    message = raw.get("message_across")
    return Network(across=_link(path, "network.across", raw.get("across"), interpolated),
                   inside=_link(path, "network.inside", raw.get("inside"), interpolated),
                   source=str(raw.get("source", "?")),
                   message_across=None if message is None else _link(path, "network.message_across", message,
                                                                     interpolated),
                   slowest_host=_number(path, "network.slowest_host", raw.get("slowest_host", 1.0), minimum=0.01))


def _compute(path: Path, raw) -> Compute | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: compute: expected a table")
    step_seconds = _table(path, raw, "step_seconds", "batch size", int)
    if not step_seconds:
        raise ConfigError(f"{path}: compute.step_seconds: expected batch size -> seconds")
    defaults = {"step_spread": 0.0, "startup_per_node": 0.0}
    numbers = {name: _number(path, f"compute.{name}", raw.get(name, defaults.get(name)))
               for name in ("update_seconds", "copy_seconds_per_byte", "evaluate_seconds_per_row",
                            "load_rows_per_second", "startup_seconds", "step_spread", "startup_per_node")}
    numbers["pace_range"] = _number(path, "compute.pace_range", raw.get("pace_range", 1.0), minimum=1.0)
    return Compute(model=str(raw.get("model", "")), parameters=int(_number(path, "compute.parameters",
                   raw.get("parameters"))), threads=int(_number(path, "compute.threads", raw.get("threads"), 1)),
                   step_seconds=step_seconds, loop_factors=_table(path, raw, "loop_factors", "batch size", int, 0.01),
                   resume_seconds=_table(path, raw, "resume_seconds", "seconds idle", float), **numbers)


def _table(path: Path, raw: dict, key: str, what: str, kind: type, minimum: float = 0.0) -> dict:
    """compute.`key`: `what` (read as `kind`, above zero) -> a number (none when absent)."""
    table = raw.get(key, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: compute.{key}: expected {what} -> number")
    try:
        keys = {name: kind(name) for name in table}
    except ValueError:
        keys = {}
    if len(keys) != len(table) or not all(math.isfinite(found) and found > 0 for found in keys.values()):
        raise ConfigError(f"{path}: compute.{key}: each {what} must be a positive {kind.__name__}")
    return {keys[name]: _number(path, f"compute.{key}.{name}", value, minimum) for name, value in table.items()}
