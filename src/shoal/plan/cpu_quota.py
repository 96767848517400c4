"""The CPU quota this process runs under, if any: what a container's CPU limit looks like from inside.

A cgroup's quota (`cpu.max` on cgroup v2; `cpu.cfs_quota_us` over `cpu.cfs_period_us` on v1) lets its
processes run `quota` seconds of every `period`, then holds them until the next period. A process that wants
more runs in turns: a timing over a few periods reads where it fell among the turns, not the machine's pace (on
a host of 10 ms turns in 80 ms periods, probe rounds of 0.2 s read one step up to 1.55x apart). The probes
(compute and network) time over many periods where they find a quota tighter than their threads.

The cgroup is found as tools that size thread pools to a container do: the process's cgroup path
(/proc/self/cgroup) under each cgroup mount of the cpu controller (/proc/self/mountinfo), the tightest quota
from there up to the mount's root.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

MOUNTS, GROUPS = Path("/proc/self/mountinfo"), Path("/proc/self/cgroup")


@dataclasses.dataclass(frozen=True)
class Quota:
    cores: float  # the quota over its period: how many cores' time the group may use
    period: float  # seconds


def cpu_quota(mounts: Path = MOUNTS, groups: Path = GROUPS) -> Quota | None:
    """The tightest CPU quota on this process's cgroup or its ancestors, or None (no quota, or none readable)."""
    try:
        paths = cgroup_paths(groups.read_text())
        found = [quota for mount in cpu_mounts(mounts.read_text())
                 for quota in mount_quotas(mount, paths)]
    except OSError:
        return None
    return min(found, key=lambda quota: quota.cores, default=None)


# periods of a CPU quota a timing spans at least: one turn more or less moves it by 1/TURNS (probe rounds of 0.2 s
# on 80 ms periods put the real loop's step at 0.75 to 1.11 times the probed one)
TURNS = 20


def least_window(threads: int) -> float:
    """Seconds a timing spans at least: TURNS periods of a CPU quota that `threads` busy threads reach, else 0."""
    quota = cpu_quota()
    return TURNS * quota.period if quota is not None and quota.cores <= threads else 0.0


@dataclasses.dataclass(frozen=True)
class Mount:
    root: str  # the cgroup path the mount shows at its mount point
    point: Path
    version: int


def cgroup_paths(text: str) -> dict[int, str]:
    """Cgroup version -> this process's path in the hierarchy holding the cpu controller."""
    paths = {}
    for line in text.splitlines():
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if number == "0" and not controllers:
            paths.setdefault(2, path)
        elif "cpu" in controllers.split(","):
            paths[1] = path
    return paths


def cpu_mounts(text: str) -> list[Mount]:
    """The cgroup mounts of /proc/self/mountinfo holding the cpu controller."""
    mounts = []
    for line in text.splitlines():
        mine, _, theirs = line.partition(" - ")
        fields, kind = mine.split(), theirs.split()
        if len(fields) < 5 or len(kind) < 3:
            continue
        if kind[0] == "cgroup2" or (kind[0] == "cgroup" and "cpu" in kind[2].split(",")):
            mounts.append(Mount(unescape(fields[3]), Path(unescape(fields[4])), 2 if kind[0] == "cgroup2" else 1))
    return mounts


def unescape(field: str) -> str:
    """A mountinfo field as written: space, tab, newline and backslash are octal escapes there."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def mount_quotas(mount: Mount, paths: dict[int, str]) -> list[Quota]:
    """Every quota set from this process's cgroup up to `mount`'s root, where the mount shows the cgroup."""
    path = paths.get(mount.version)
    if path is None:
        return []
    relative = Path(path).relative_to(mount.root) if Path(path).is_relative_to(mount.root) else None
    if relative is None:
        return []
    folder, found = mount.point / relative, []
    while True:
        quota = read_quota(folder, mount.version)
        if quota is not None:
            found.append(quota)
        if folder == mount.point or mount.point not in folder.parents:
            return found
        folder = folder.parent


def read_quota(folder: Path, version: int) -> Quota | None:
    """The quota set on one cgroup folder, or None where none is set (or readable)."""
    try:
        if version == 2:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        else:
            quota = (folder / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu.cfs_period_us").read_text().strip()
        if quota in ("max", "-1") or int(period) <= 0:
            return None
        return Quota(cores=int(quota) / int(period), period=int(period) / 1e6)
    except (OSError, ValueError):
        return None
