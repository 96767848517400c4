"""An emulated cluster on one machine: each host a network namespace with its own address on a
bridge, its own hostname (resolving to a loopback address inside it, as on a stock Debian or
Ubuntu box), its own /tmp, its own CPU core and a rate-shaped link. A checkout under /tmp (with its
.venv) stays visible at its own path on every host, as an NFS home would on a real cluster.

More hosts than cores are emulated by time dilation (`dilation` D): each host gets 1/D of a core
(its processes in a cgroup whose CPU quota is `slice_ms` in every D x `slice_ms`, D hosts to a core) and a
link at 1/D of `rate`, so every host computes and sends D times slower than the machine it stands for, and
times measured on the cluster, divided by D, estimate that machine's. Each core the hosts use also runs a
keeper, a spinning process of the idle scheduling class: it takes only time no host wants, and so the
virtual CPU never idles, which on a VM cost a host up to half its speed (the hypervisor lends the idle
core away and the host returns to a cold one; benchmarks/results/README.md, Time dilation). What dilation
cannot slow: the kernel's per-message cost and the wake-up of a waiting process (a message is relatively D
times cheaper), and caches, which D hosts on one core share; and a host that waits for a message may wait up
to the rest of its period (D - 1 slices) for its next turn.

Tests, benchmarks and the planner start commands "on host i" through `EmulatedCluster.start`.
Everything it creates (namespaces, the bridge, the hosts' processes, its folders) is removed by
`close`, which also runs when the `with` block fails.
"""

from __future__ import annotations

import itertools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shoal.cluster.interface import SOCKET_VARIABLES
from shoal.plan.calibrate import parse_rate

SUBNET = "10.77.0"
TMP = Path("/tmp")
# a host's turn on its core: 1 ms slices made a dilated averaging epoch 1.45x too long (each turn resumes
# cold), 50 ms ones stretch a sync step's wait for a peer's turn; 10 ms: sync 1.03x, averaging 1.21x (README)
SLICE_MS = 10
_BUILT = itertools.count()  # clusters built by this process; names stay within Linux's 15 characters
CHECKOUT = Path(__file__).resolve().parents[2]


def missing_requirements(hosts: int, dilation: int = 1) -> str | None:
    """Why an emulated cluster of `hosts` (dilated by `dilation`) cannot be built here, or None."""
    if os.geteuid() != 0:
        return "the emulated cluster needs root (network, UTS and mount namespaces)"
    for tool in ("ip", "tc", "unshare", "taskset"):
        if shutil.which(tool) is None:
            return f"the emulated cluster needs `{tool}`"
    if len(os.sched_getaffinity(0)) * dilation < hosts:
        return (f"the emulated cluster gives each of its {hosts} hosts 1/{dilation} of a core; this machine has "
                f"fewer than {-(-hosts // dilation)} cores")
    if dilation > 1 and cpu_cgroups() is None:
        return "a dilated cluster needs the cgroup cpu controller (v1 at /sys/fs/cgroup/cpu, or v2)"
    if dilation > 1 and not os.access(cpu_cgroups()[0], os.W_OK):
        return "a dilated cluster makes cgroups, and this machine's cgroup folder is read-only"
    return None


def cpu_cgroups() -> tuple[Path, int] | None:
    """Where CPU-limited cgroups are made here, and the cgroup version (1 or 2); None without the cpu controller."""
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists():
        return v1, 1
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.subtree_control"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return v2, 2
    return None


def under_tmp(folders) -> list[Path]:
    """Those of `folders` that a host's own /tmp would hide, outermost only (one mount covers what it holds)."""
    found = [folder for folder in (Path(folder).resolve() for folder in folders)
             if folder != TMP and folder.is_relative_to(TMP) and folder.is_dir()]
    return sorted({folder for folder in found
                   if not any(other != folder and folder.is_relative_to(other) for other in found)})


def code_folders() -> list[Path]:
    """What every host runs from: the checkout (its code, its .venv), the Python running this, the data beside it."""
    return [CHECKOUT, Path(sys.prefix), Path(sys.executable).resolve().parent, CHECKOUT.parent / "shared"]


def unset_interfaces(env: dict | None) -> dict:
    """`env` (default: this process's) without a chosen network interface: hosts find theirs as a user's would."""
    return {key: value for key, value in (env or os.environ).items() if key not in SOCKET_VARIABLES}


class HostCommandFailed(subprocess.CalledProcessError):
    """A command run on a host failed; its message ends with the command's last error lines."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{(self.stderr or '')[-2000:]}"


def _ip(*arguments: str) -> None:
    subprocess.run(["ip", *arguments], check=True, capture_output=True, text=True)


def burst_bytes(rate: str) -> int:
    """tbf's token bucket for `rate`: 128 µs of the line, and at least a full frame. A larger bucket lets an
    occasional exchange (a once-per-epoch average, a step's gradients after its compute) pass at the
    bridge's speed, which a real link of that rate never does; much smaller ones fall short of the rate."""
    return max(int(parse_rate(rate) / 8 * 128e-6), 1600)


class EmulatedCluster:
    """`hosts` hosts named host0, host1, ... at 10.77.0.1, .2, ..., linked at `rate` (tc tbf syntax). The
    folders in `keep` (default: `code_folders()`) that lie under /tmp are seen by every host at their own path.
    Each host has a core of its own unless `cores` says which each takes (indexes into this process's cores;
    several hosts may share one: machines of unequal speed). With `dilation` D above 1, each host has 1/D of a
    core (D hosts to a core, in turn, `slice_ms` at a time) and a link at `rate` / D: see the module's
    docstring."""

    def __init__(self, hosts: int = 2, rate: str = "1gbit", keep=None, cores: list[int] | None = None,
                 dilation: int = 1, slice_ms: int = SLICE_MS):
        if dilation < 1:
            raise ValueError(f"dilation: at least 1, got {dilation}")
        if slice_ms < 1:
            raise ValueError(f"slice_ms: at least 1, got {slice_ms}")
        self.hosts, self.rate, self.dilation, self.slice_ms = hosts, rate, dilation, slice_ms
        self.keepers: list[subprocess.Popen] = []
        self.link_rate = rate if dilation == 1 else f"{int(parse_rate(rate) / dilation)}bit"
        self.cgroups: list[Path] = []
        self.kept = under_tmp(code_folders() if keep is None else keep)
        # a letter of its own: two clusters may stand at once in one process (tests/cluster/test_plan.py)
        self.prefix = f"shoal{os.getpid() % 100000}{chr(ord('a') + next(_BUILT) % 26)}"
        self.folder = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-", dir="/var/tmp"))
        self.shared = self.folder / "shared"  # the same folder, at the same path, on every host
        self.processes: list[subprocess.Popen] = []
        available = sorted(os.sched_getaffinity(0))
        if cores is not None and len(cores) != hosts:
            raise ValueError(f"cores: one per host, got {len(cores)} for {hosts} hosts")
        if cores is not None:
            self.cores = [available[index] for index in cores]
        else:  # dilated: hosts take the cores in turn, D to a core
            self.cores = [available[host % len(available)] for host in range(hosts)] if dilation > 1 \
                else available[:hosts]
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    @property
    def cgroup_view(self) -> Path:
        """The cpu controller's cgroups, bind-mounted where every host sees them (dilated clusters)."""
        return self.folder / "cgroups"

    def namespace(self, host: int) -> str:
        return f"{self.prefix}-h{host}"

    def address(self, host: int) -> str:
        return f"{SUBNET}.{host + 1}"

    def hostname(self, host: int) -> str:
        return f"host{host}"

    def private(self, host: int) -> Path:
        """What host `host` sees as /tmp."""
        return self.folder / f"host{host}-tmp"

    def _build(self) -> None:
        self.shared.mkdir()
        switch = f"{self.prefix}-sw"
        _ip("netns", "add", switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for host in range(self.hosts):
            self._add_host(host, switch)
        if self.dilation > 1:
            self._limit_cpu()
        self._write_enter()

    def _limit_cpu(self) -> None:
        """A cgroup per host whose processes run at most `slice_ms` in every D slices: 1/D of a core, in turns
        short enough that a waiting host is woken within a period; and a keeper on each of the hosts' cores."""
        root, version = cpu_cgroups()
        quota = 1000 * self.slice_ms
        period = quota * self.dilation
        # `ip netns exec` mounts a sysfs of its own over /sys: a host reaching another (`enter`, as a launcher's
        # ssh does) finds the cgroups here instead, in the cluster's folder, which every host sees
        self.cgroup_view.mkdir()
        subprocess.run(["mount", "--bind", str(root), str(self.cgroup_view)], check=True, capture_output=True)
        for host in range(self.hosts):
            group = root / f"{self.prefix}-h{host}"
            group.mkdir()
            self.cgroups.append(group)
            if version == 1:
                (group / "cpu.cfs_period_us").write_text(str(period))
                (group / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (group / "cpu.max").write_text(f"{quota} {period}")
        for core in sorted(set(self.cores)):
            keeper = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            self.keepers.append(keeper)
            # the idle class's weight is 3 against a host's 1024: it runs only when no host wants the core
            os.sched_setscheduler(keeper.pid, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setaffinity(keeper.pid, {core})

    def _add_host(self, host: int, switch: str) -> None:
        namespace, outside, inside = self.namespace(host), f"{self.prefix}v{host}", f"{self.prefix}e{host}"
        _ip("netns", "add", namespace)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", outside, "netns", switch)
        _ip("link", "set", inside, "netns", namespace)
        _ip("-n", namespace, "link", "set", inside, "name", "eth0")
        _ip("-n", switch, "link", "set", outside, "master", "br0", "up")
        _ip("-n", namespace, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                        "rate", self.link_rate, "burst", str(burst_bytes(self.link_rate)), "latency", "50ms"],
                       check=True, capture_output=True)
        # `ip netns exec` bind-mounts /etc/netns/NAME/hosts over /etc/hosts: the hostname maps to loopback
        hosts_file = Path("/etc/netns") / namespace / "hosts"
        hosts_file.parent.mkdir(parents=True, exist_ok=True)
        others = "".join(f"{self.address(other)} {self.hostname(other)}\n" for other in range(self.hosts)
                         if other != host)  # the others by name, as a site's DNS would tell
        hosts_file.write_text(f"127.0.0.1 localhost\n127.0.1.1 {self.hostname(host)}\n{others}")
        self.private(host).mkdir()
        for folder in self.kept:
            (self.private(host) / folder.relative_to(TMP)).mkdir(parents=True, exist_ok=True)

    def command(self, host: int, command: list[str]) -> list[str]:
        """`command` as run on `host`: its namespace, hostname, /tmp and core. The kept folders are mounted into
        the host's /tmp before it replaces the machine's, which would hide them."""
        private = self.private(host)
        keep = "".join(f"mount --bind {shlex.quote(str(folder))} {shlex.quote(str(private / folder.relative_to(TMP)))}"
                       " && " for folder in self.kept)
        setup = (f"hostname {self.hostname(host)} && {keep}mount --rbind {shlex.quote(str(private))} /tmp && "
                 f'exec taskset -c {self.cores[host]} "$@"')
        entered = ["ip", "netns", "exec", self.namespace(host), "unshare", "--uts", "--mount", "--propagation",
                   "private", "--", "sh", "-c", setup, "sh", *command]
        if not self.cgroups:
            return entered
        # joined before `ip netns exec`, which mounts a sysfs of the namespace's own over /sys/fs/cgroup
        procs = self.cgroup_view / self.cgroups[host].name / "cgroup.procs"
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *entered]

    @property
    def enter(self) -> Path:
        """A script that runs a command line on a host as ssh would: `enter HOST 'COMMAND LINE'` (HOST its
        name or address; the words after it joined by spaces and read by sh). Launchers that reach other
        machines through ssh (mpirun, mpiexec, shoal's --hosts) take it in ssh's place."""
        return self.folder / "enter"

    def _write_enter(self) -> None:
        cases = "".join(f"  {self.hostname(host)}|{self.address(host)}) exec {shlex.join(self.command(host, ['sh']))}"
                        f' -c "$*" ;;\n' for host in range(self.hosts))
        self.enter.write_text(f'#!/bin/sh\nhost=$1\nshift\ncase "$host" in\n{cases}'
                              f'  *) echo "ssh: Could not resolve hostname $host" >&2; exit 255 ;;\nesac\n')
        self.enter.chmod(0o755)

    def start(self, host: int, command: list[str], env: dict | None = None, log: Path | None = None,
              **options) -> subprocess.Popen:
        """Start `command` on `host` (in a session of its own); its output goes to `log` when given."""
        output = open(log, "w") if log else subprocess.DEVNULL
        process = subprocess.Popen(self.command(host, command), env=unset_interfaces(env), stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True, **options)
        if log:
            output.close()
        self.processes.append(process)
        return process

    def run(self, host: int, command: list[str], env: dict | None = None, timeout: float = 60) -> str:
        """Run `command` on `host` to its end; its output (a failure raises an error with its last lines)."""
        done = subprocess.run(self.command(host, command), env=unset_interfaces(env), capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise HostCommandFailed(done.returncode, command, done.stdout, done.stderr)
        return done.stdout

    def cut_link(self, host: int) -> None:
        """Take `host`'s network link down, as a pulled cable would (no packet is answered or refused)."""
        _ip("-n", self.namespace(host), "link", "set", "eth0", "down")

    def restore_link(self, host: int) -> None:
        _ip("-n", self.namespace(host), "link", "set", "eth0", "up")

    def pids(self, host: int) -> list[int]:
        """Every process still running on `host`."""
        found = subprocess.run(["ip", "netns", "pids", self.namespace(host)], capture_output=True, text=True)
        return [int(pid) for pid in found.stdout.split()]

    def stop_processes(self) -> None:
        """End every process started on the hosts, and anything else left in their namespaces."""
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        self.processes.clear()
        for host in range(self.hosts):
            for pid in self.pids(host):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def close(self) -> None:
        self.stop_processes()
        for keeper in self.keepers:
            keeper.kill()
            keeper.wait()
        for name in [*(self.namespace(host) for host in range(self.hosts)), f"{self.prefix}-sw"]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
        for group in self.cgroups:
            _remove_cgroup(group)
        if self.cgroup_view.is_mount():
            subprocess.run(["umount", str(self.cgroup_view)], check=True, capture_output=True)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> EmulatedCluster:
        return self

    def __exit__(self, *exception) -> None:
        self.close()


def _remove_cgroup(group: Path) -> None:
    """Kill whatever still runs in a host's cgroup (a process forked after the namespace was emptied), then rmdir
    it once the kernel has let them go; a cgroup that will not go is said, not left silently."""
    for _ in range(100):
        try:
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    print(f"tests.cluster.hosts: could not remove the cgroup {group}", file=sys.stderr)
