"""The CPU quota found as a process in a container finds it: its cgroup path under each cpu cgroup mount, the
tightest quota from there up to the mount's root."""

from __future__ import annotations

from pathlib import Path

from shoal.plan import cpu_quota as quotas
from shoal.plan.cpu_quota import Quota, cpu_quota, unescape

V1_GROUPS = "12:pids:/\n4:cpu,cpuacct:/jobs/host0\n1:name=systemd:/\n0::/\n"
V2_GROUPS = "0::/pods/worker\n"


def mountinfo(*lines: str) -> str:
    common = "22 1 0:20 / /proc rw,nosuid - proc proc rw\n"
    return common + "".join(line + "\n" for line in lines)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def find(tmp_path: Path, mounts: str, groups: str) -> Quota | None:
    return cpu_quota(write(tmp_path, "mountinfo", mounts), write(tmp_path, "cgroup", groups))


def v1_group(root: Path, path: str, quota: int, period: int) -> None:
    write(root / path, "cpu.cfs_quota_us", f"{quota}\n")
    write(root / path, "cpu.cfs_period_us", f"{period}\n")


def test_a_v1_quota_on_the_processs_cgroup_is_found_under_the_cpu_mount(tmp_path):
    hierarchy = tmp_path / "cpu"
    v1_group(hierarchy, ".", -1, 100000)
    v1_group(hierarchy, "jobs", -1, 100000)
    v1_group(hierarchy, "jobs/host0", 10000, 80000)
    mounts = mountinfo(f"31 23 0:28 / {hierarchy} rw - cgroup cgroup rw,cpu,cpuacct",
                       f"32 23 0:29 / {tmp_path / 'memory'} rw - cgroup cgroup rw,memory")
    assert find(tmp_path, mounts, V1_GROUPS) == Quota(cores=0.125, period=0.08)


def test_the_tightest_quota_from_the_cgroup_up_to_the_root_is_kept(tmp_path):
    hierarchy = tmp_path / "cpu"
    v1_group(hierarchy, "jobs", 50000, 100000)  # half a core for every job
    v1_group(hierarchy, "jobs/host0", 200000, 100000)  # two cores for this one: the parent's half binds
    mounts = mountinfo(f"31 23 0:28 / {hierarchy} rw - cgroup cgroup rw,cpu")
    assert find(tmp_path, mounts, V1_GROUPS) == Quota(cores=0.5, period=0.1)


def test_a_mount_of_part_of_the_hierarchy_shows_the_cgroup_below_its_root(tmp_path):
    """A container sees its own cgroup at the mount point: the mount's root is the cgroup's path."""
    view = tmp_path / "container cgroup"  # a space, written \\040 in mountinfo
    write(view, "cpu.max", "150000 100000\n")
    mounts = mountinfo(f"40 23 0:30 /pods/worker {str(view).replace(' ', chr(92) + '040')} rw - cgroup2 cgroup2 rw")
    assert find(tmp_path, mounts, V2_GROUPS) == Quota(cores=1.5, period=0.1)


def test_no_quota_set_or_none_readable_is_none(tmp_path):
    hierarchy = tmp_path / "unified"
    write(hierarchy / "pods/worker", "cpu.max", "max 100000\n")
    write(hierarchy, "cpu.max", "garbled\n")
    mounts = mountinfo(f"40 23 0:30 / {hierarchy} rw - cgroup2 cgroup2 rw")
    assert find(tmp_path, mounts, V2_GROUPS) is None
    assert find(tmp_path, mounts, "0::/elsewhere\n") is None  # a cgroup with no folder: nothing to read
    assert find(tmp_path, mountinfo(f"40 23 0:30 /other {hierarchy} rw - cgroup2 cgroup2 rw"), V2_GROUPS) is None
    assert cpu_quota(tmp_path / "absent", tmp_path / "absent") is None


def test_mountinfos_octal_escapes_are_read():
    assert unescape(r"/mnt/a\040b\011c\134d") == "/mnt/a b\tc\\d"


def test_timings_span_the_quotas_periods_only_where_the_threads_reach_it(monkeypatch):
    monkeypatch.setattr(quotas, "cpu_quota", lambda: Quota(cores=0.125, period=0.08))
    assert quotas.least_window(1) == quotas.TURNS * 0.08
    monkeypatch.setattr(quotas, "cpu_quota", lambda: Quota(cores=4.0, period=0.1))
    assert quotas.least_window(2) == 0.0  # two threads never reach a quota of four cores
    assert quotas.least_window(4) == quotas.TURNS * 0.1
    monkeypatch.setattr(quotas, "cpu_quota", lambda: None)
    assert quotas.least_window(64) == 0.0
