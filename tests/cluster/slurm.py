"""A real SLURM on the emulated cluster: munged for authentication, slurmctld on host 0 and a slurmd on
every host, each in its host's namespaces, all reading one slurm.conf (SLURM_CONF) in the cluster's
folder. Everything it starts dies with `close`, and its files live in the cluster's folder.

Three settings make it fit a test: each slurmd mounts the machine's cgroup v1 controllers again
(`ip netns exec` gives a host a sysfs without them, and slurmd will not start without cgroups);
credentials live 5 s (a requeued job waits that long plus one, not 2 minutes); the scheduler runs
every second (not every minute)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "scontrol")
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "pids")
MOUNT_CGROUPS = ("mount -t tmpfs cgroups /sys/fs/cgroup && " + " && ".join(
    f"mkdir /sys/fs/cgroup/{name} && mount -t cgroup -o {name} cgroup /sys/fs/cgroup/{name}" for name in CONTROLLERS))


def missing_requirements() -> str | None:
    for program in DAEMONS:
        if shutil.which(program) is None:
            return f"a real SLURM needs `{program}` (make test installs slurm-wlm and munge when run as root)"
    return None


class EmulatedSlurm:
    def __init__(self, cluster, env: dict | None = None):
        self.cluster = cluster
        self.folder = cluster.folder / "slurm"
        self.folder.mkdir()
        self.conf = self.folder / "slurm.conf"
        self.socket = self.folder / "munge.socket"
        self.env = {**(env or os.environ), "SLURM_CONF": str(self.conf)}
        self.processes: list[subprocess.Popen] = []
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _write_conf(self) -> None:
        nodes = "".join(f"NodeName={self.cluster.hostname(host)} NodeAddr={self.cluster.address(host)} CPUs=1 "
                        f"RealMemory=500 State=UNKNOWN\n" for host in range(self.cluster.hosts))
        self.conf.write_text(f"""ClusterName=shoal
SlurmctldHost={self.cluster.hostname(0)}({self.cluster.address(0)})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket},cred_expire=5
CredType=cred/munge
StateSaveLocation=/tmp/slurm/state
SlurmdSpoolDir=/tmp/slurm/spool
SlurmctldPidFile=/tmp/slurm/slurmctld.pid
SlurmdPidFile=/tmp/slurm/slurmd.pid
SlurmctldLogFile={self.folder}/slurmctld.log
SlurmdLogFile={self.folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
{nodes}PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _start(self) -> None:
        self._write_conf()
        (self.folder / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={self.socket}",
                        f"--pid-file={self.folder / 'munged.pid'}", f"--log-file={self.folder / 'munged.log'}",
                        f"--seed-file={self.folder / 'munged.seed'}"], check=True, capture_output=True, timeout=30)
        self.munged = int((self.folder / "munged.pid").read_text())
        self._daemon(0, ["sh", "-c", "mkdir -p /tmp/slurm/state /tmp/slurm/spool && exec slurmctld -D -i"])
        time.sleep(1)
        for host in range(self.cluster.hosts):
            # `ip netns exec` mounts a sysfs of its own, without the machine's cgroups, which slurmd reads
            self._daemon(host, ["sh", "-c", f"mkdir -p /tmp/slurm/spool && {MOUNT_CGROUPS} && exec slurmd -D"])
        self.wait_until_idle()

    def _daemon(self, host: int, command: list[str]) -> None:
        log = self.folder / f"daemon-{len(self.processes)}.out"
        self.processes.append(self.cluster.start(host, command, env=self.env, log=log))

    def run(self, host: int, command: list[str], timeout: float = 30) -> str:
        return self.cluster.run(host, command, env=self.env, timeout=timeout)

    def wait_until_idle(self, seconds: float = 60) -> None:
        """Every node registered and idle."""
        deadline = time.monotonic() + seconds
        states = ""
        while time.monotonic() < deadline:
            try:
                states = self.run(0, ["sinfo", "-h", "-N", "-o", "%N %t"])
            except subprocess.SubprocessError as error:
                states = str(error)
            if states and all(line.split()[-1] == "idle" for line in states.strip().splitlines()) and \
                    len(states.strip().splitlines()) == self.cluster.hosts:
                return
            time.sleep(0.5)
        raise RuntimeError(f"SLURM's nodes did not come up: {states}\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text()[-2000:]}" for path in sorted(self.folder.glob("*.log")))

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)
        if getattr(self, "munged", None):
            try:
                os.kill(self.munged, 9)
            except ProcessLookupError:
                pass

    def __enter__(self) -> EmulatedSlurm:
        return self

    def __exit__(self, *exception) -> None:
        self.close()
