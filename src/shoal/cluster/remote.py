"""One command from one terminal: `shoal train job.toml --hosts h0:4,h1:4` starts every machine's node.

Like mpirun, horovodrun and DeepSpeed, the head runs each host's `shoal train` through a remote
command (`ssh {host}` by default, `cluster.remote` to change it: the command line is added as
one last argument, as ssh takes it). The first host is where the machines meet; every node gets
its rank, its worker count (each host its own: `h0:4,h1:2`), the endpoint and the same run
directory, so nothing is set by hand. The job file, the data and shoal itself must be at the same
paths on every host (a shared home, or the same image), as mpirun expects. Each host's output
comes back prefixed by its name.

The head makes up the job's secret (see shoal.cluster.node.rendezvous) and writes it as the first line
of each node's input, which it keeps open anyway: it is never on a command line, where `ps` on
either machine would show it.

Ctrl-C (or SIGTERM) stops every host: the head closes each node's input and interrupts its
remote command. A node started this way stops when its input closes, so a lost ssh connection
stops that node too. A host that cannot be reached (ssh's exit status 255) is one line naming it,
and the other hosts are stopped.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from shoal.cluster.signals import interruptible
from shoal.errors import ConfigError, ShoalError

UNREACHABLE = 255  # ssh's exit status when it could not connect
STARTED = "shoal: node started"
STOP_SECONDS = 20.0  # after the interrupt, before the head kills a remote command
SETTLE_SECONDS = 15.0  # after one node failed, before the head stops the others (they normally follow)


@dataclass(frozen=True)
class Host:
    name: str
    workers: str | None = None
    """A count, "auto", or None for the command's --workers."""


def parse_hosts(entries: list[str], where: str) -> list[Host]:
    """["h0:4", "h1"] -> hosts; `where` names the source in errors (--hosts, a hostfile's line, cluster.hosts)."""
    hosts = []
    for entry in entries:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.\-\[\]:]+?)(?::(\d+|auto))?\s*", entry)
        if match is None or (match.group(2) or "auto").strip("0") == "":  # no workers: 0, 00, ...
            raise ConfigError(f"{where}: cannot read host {entry!r} (expected NAME or NAME:WORKERS, like node1:4)")
        hosts.append(Host(match.group(1), match.group(2)))
    if not hosts:
        raise ConfigError(f"{where}: no hosts")
    names = [host.name for host in hosts]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"{where}: host {repeated[0]!r} given twice (one node per host; give it more workers)")
    return hosts


def read_hostfile(path: Path) -> list[Host]:
    """One host per line: `name`, `name:workers` or Open MPI's `name slots=N`; # starts a comment."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise ConfigError(f"--hostfile: cannot read {path}: {error.strerror}") from None
    hosts = []
    for number, line in enumerate(lines, start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        slots = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)", text)
        hosts += parse_hosts([f"{slots.group(1)}:{slots.group(2)}" if slots else text], f"{path}:{number}")
    if not hosts:
        raise ConfigError(f"{path}: no hosts in the hostfile")
    return parse_hosts([f"{host.name}:{host.workers}" if host.workers else host.name for host in hosts], str(path))


def remote_command(template: str, host: str, command: list[str]) -> list[str]:
    """The template's words with {host} filled in, then the command as one shell line (as ssh takes it)."""
    return [word.replace("{host}", host) for word in shlex.split(template)] + [shlex.join(command)]


def agree_workers(hosts: list[Host], workers: str, template: str, job: str, overrides: list[str]) -> list[int]:
    """Each host's worker count, in the hosts' order: its own (`name:N`) or else `workers`; `auto` is what
    that host holds, asked of it through `template`. Hosts may run different counts: ranks stay contiguous
    on each machine (shoal.cluster.node.agent)."""
    wanted = [host.workers or workers for host in hosts]
    counts = []
    for host, count in zip(hosts, wanted):
        if count != "auto":
            counts.append(int(count))
            continue
        probe = [sys.executable, "-m", "shoal.train.capacity", job, "--nodes", str(len(hosts))]
        for override in overrides:
            probe += ["--set", override]
        answer = subprocess.run(remote_command(template, host.name, probe), capture_output=True, text=True,
                                timeout=120)
        if answer.returncode != 0:
            last = (answer.stderr.strip().splitlines() or ["no answer"])[-1]
            raise ShoalError(f"{host.name}: could not ask its cores and memory through {template!r}: {last}")
        count, reason = answer.stdout.strip().splitlines()[-1].split("\t", 1)
        counts.append(int(count))
        print(f"shoal: --workers auto: {host.name}: {reason}", file=sys.stderr)
    if "auto" in wanted:
        told = ", ".join(f"{host.name} {count}" for host, count in zip(hosts, counts))
        print(f"shoal: --workers auto: {told} ({sum(counts)} in all)", file=sys.stderr)
    return counts


def node_commands(hosts: list[Host], arguments: list[str], counts: list[int], port: int) -> list[list[str]]:
    """Each host's `shoal train` command line: `arguments` plus its rank, its worker count (`counts`, in the
    hosts' order) and the meeting place."""
    endpoint = f"{hosts[0].name}:{port}"
    return [[sys.executable, "-m", "shoal", "train", *arguments, "--workers", str(count), "--nnodes", str(len(hosts)),
             "--node-rank", str(rank), "--rdzv-endpoint", endpoint, "--stop-when-input-closes"]
            for rank, count in enumerate(counts)]


class Fleet:
    """The head: every host's node started, its output relayed, stopped together."""

    def __init__(self, hosts: list[Host], commands: list[list[str]], template: str, secret: str = ""):
        self.hosts, self.commands, self.template, self.secret = hosts, commands, template, secret
        self.processes: list[subprocess.Popen] = []
        self.printing = threading.Lock()
        self.relays: list[threading.Thread] = []
        self.last_line: dict[str, str] = {}
        self.reached: set[str] = set()  # hosts whose node said it started
        self.stopped: set[int] = set()  # processes the head stopped (their exit is not their own)
        self.failure: tuple[str, int] | None = None  # the first host that failed by itself, and its status

    def run(self) -> int:
        """Start every node and wait for all; the first failed node's exit status (130 after Ctrl-C)."""
        with interruptible():
            try:
                for host, command in zip(self.hosts, self.commands):
                    self.start(host, command)
                return self.wait()
            finally:
                self.stop(signal.SIGINT)
                for relay in self.relays:
                    relay.join(timeout=5)

    def start(self, host: Host, command: list[str]) -> None:
        try:
            process = subprocess.Popen(remote_command(self.template, host.name, command), stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as error:
            raise ShoalError(f"cluster.remote: cannot run {shlex.split(self.template)[0]!r} for {host.name}: "
                             f"{error.strerror}") from None
        self.processes.append(process)
        try:
            process.stdin.write(f"{self.secret}\n".encode())
            process.stdin.flush()
        except OSError:  # the remote command is gone already: its exit says why
            pass
        relay = threading.Thread(target=self.relay, args=(host.name, process), daemon=True)
        relay.start()
        self.relays.append(relay)

    def relay(self, name: str, process: subprocess.Popen) -> None:
        """The host's output, each line prefixed by the host's name."""
        for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(STARTED):
                self.reached.add(name)
            if line.strip():
                self.last_line[name] = line
            with self.printing:
                print(f"[{name}] {line}", flush=True)

    def wait(self) -> int:
        settle_until = None
        while True:
            for index, (host, process) in enumerate(zip(self.hosts, self.processes)):
                code = process.poll()
                if code in (None, 0) or index in self.stopped or self.failure is not None:
                    continue
                time.sleep(0.2)  # its last lines
                reason = self.last_line.get(host.name, "").strip() or f"exit status {code}"
                if code == UNREACHABLE and host.name not in self.reached:
                    self.stop(signal.SIGINT)
                    raise ShoalError(f"{host.name}: could not be reached through {self.template!r}: {reason}")
                self.failure = (host.name, code)
                print(f"shoal: error: {host.name}: {reason}", file=sys.stderr, flush=True)
                settle_until = time.monotonic() + SETTLE_SECONDS
            codes = [process.poll() for process in self.processes]
            if all(code is not None for code in codes):
                if self.failure:
                    return self.failure[1]
                self.check_started()
                return max(codes)
            if settle_until is not None and time.monotonic() > settle_until:  # the others did not follow
                self.stop(signal.SIGINT)
            time.sleep(0.1)

    def check_started(self) -> None:
        """Every node ended well: each must have said it started, or the remote command ran something else
        (a template that drops the command line exits 0 having trained nothing)."""
        for relay in self.relays:
            relay.join(timeout=5)  # the nodes' last lines
        for host in self.hosts:
            if host.name not in self.reached:
                raise ShoalError(f"{host.name}: never started its node: {self.template!r} ended without running "
                                 "shoal there")

    def stop(self, number: int) -> None:
        """Close every node's input and interrupt its remote command; kill what outlives STOP_SECONDS."""
        running = [(index, process) for index, process in enumerate(self.processes) if process.poll() is None]
        for index, process in running:
            self.stopped.add(index)
            try:
                process.stdin.close()  # a node reached over ssh stops on this alone
            except OSError:
                pass
        if running:
            time.sleep(0.5)
        for _, process in running:
            try:
                os.killpg(process.pid, number)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_SECONDS
        for _, process in running:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def stop_when_input_closes() -> str | None:
    """A node started by the head: say so (the head tells an unreachable host from a failed node by it),
    and interrupt this launcher when its input closes (Ctrl-C at the head, or a lost connection).
    Returns the job's secret, the input's first line (None if there is none)."""
    print(f"{STARTED} on {socket.gethostname()}", flush=True)
    secret = sys.stdin.buffer.readline().decode(errors="replace").strip() or None

    def watch() -> None:
        while sys.stdin.buffer.read(65536):
            pass
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, name="shoal-input-watch", daemon=True).start()
    return secret
