"""Workers forked from a process that has already imported them.

A worker's imports (torch above all) take about 2.5 s of a core, and shoal's launcher imports torch
for its agent before it can start any: a job's first step waited for both, one after the other, and
every restart paid the workers' part again. `shoal train` starts a fork server first thing; it imports
the worker module while the launcher imports torch (on another core where there is one), and each
worker is then forked from it, already imported. torch's agent still starts and watches one process
per worker, a light stand-in (shoal.cluster.node.standin) that has the server fork its worker.

A forked worker takes its stand-in's arguments, folder, environment, import path, standard streams
and ignored signals. What a library reads from the environment as it loads (torch's, OpenMP's) was
read in the server, with the launcher's environment: a worker sets its threads itself.

The server answers its launcher only: a signal to every process of the job (Ctrl-C, scancel) reaches
the workers, which stop as they would, not the server. It ends when the launcher closes its control
pipe: killing the workers still running when told to stop, leaving them to stop as orphans
(shoal.cluster.orphan) when the launcher is simply gone. It kills a worker whose stand-in is gone
(the agent's SIGKILL after its grace time), with that worker's process group.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import resource
import runpy
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import NoReturn

from shoal.cluster import scratch
from shoal.cluster.environments import ShoalLauncher
from shoal.process import end_process, flush_output

MODULE = "shoal.cluster.node.forkserver"
STAND_IN = "shoal.cluster.node.standin"
WORKER_MODULE = "shoal.worker"  # what shoal's launcher starts (a string: the module is imported by the server only)
BACKLOG = 256  # stand-ins waiting while the server imports: a machine's workers, and more
REQUEST_SECONDS = 10.0  # a stand-in sends its request at once; one that stalls is dropped
LARGEST_REQUEST = 64 << 20  # bytes: arguments and an environment, with room to spare
# what a stand-in passes on to its worker: what the agent, a terminal or SLURM send
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
NUMBER = struct.Struct("!q")  # a length, a pid or an exit status (negative: the signal that ended it)
STREAMS = (0, 1, 2)
STOP = b"s"  # the launcher's word on the control pipe: done, end any worker left (bare EOF: the launcher is gone)
READY = b"r"  # the server's word: imported, forking


class ForkServer:
    """A fork server of this process (the launcher), importing `module` from the moment it starts."""

    def __init__(self, module: str):
        self.module = module
        self.folder = scratch.make(scratch.SERVER)  # mode 0700: no other user may ask it for workers
        self.path = os.path.join(self.folder, "socket")
        control, self.control = os.pipe()  # the server's end reads EOF once this process ends, however it ends
        self.ready, ready = os.pipe()  # the server writes READY once it has imported the module
        try:
            # listening from here on: a stand-in that comes before the server has started waits in the backlog
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
                listener.bind(self.path)
                listener.listen(BACKLOG)
                # a session of its own: the terminal's Ctrl-C is for the launcher to pass on
                self.process = subprocess.Popen(
                    [sys.executable, "-u", "-m", MODULE, str(listener.fileno()), str(control), str(ready), module],
                    stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=[listener.fileno(), control, ready])
        except BaseException:
            os.close(self.control)
            os.close(self.ready)
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        finally:
            os.close(control)
            os.close(ready)

    def arguments(self, worker: list[str]) -> list[str]:
        """The interpreter arguments that start one worker (`worker`: the module's own arguments) from here."""
        return ["-u", "-m", STAND_IN, self.path, self.module, *worker]

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Wait until the server has imported its module (or given up: False), so that the next worker starts
        forked at once (a scaling study's first trial must not hold the import its others do not)."""
        if self.ready is None:
            return False
        readable, _, _ = select.select([self.ready], [], [], timeout)
        answer = os.read(self.ready, 1) if readable else b""
        self._close_ready_pipe()
        return answer == READY

    def _close_ready_pipe(self) -> None:
        """Close the end the server's READY comes on (asked once, or not at all)."""
        if self.ready is not None:
            os.close(self.ready)
            self.ready = None

    def close(self) -> None:
        """Stop the server (killing any worker still forked from it) and remove its folder."""
        self._close_ready_pipe()
        if self.control is not None:
            with contextlib.suppress(OSError):
                os.write(self.control, STOP)
            os.close(self.control)
            self.control = None
            # still importing, it has no workers and would see STOP only after its import: it goes at once
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def start(module: str = WORKER_MODULE) -> ForkServer | None:
    """Start a fork server of this process for `module`; None where it cannot (a temporary folder whose path
    is too long for a socket), and the workers start on their own. The caller closes it."""
    with contextlib.suppress(OSError):
        return ForkServer(module)
    return None


@contextlib.contextmanager
def serving(module: str = WORKER_MODULE, wanted: bool = True) -> Iterator[ForkServer | None]:
    """A fork server (or None: not `wanted`, or it could not start) for as long as the block runs, closed
    however the block ends. It is handed down to each launch, never found through a global."""
    server = start(module) if wanted else None
    try:
        yield server
    finally:
        if server is not None:
            server.close()


# --- the server --------------------------------------------------------------------------------------


def serve(listening: int, control: int, ready: int, module: str) -> None:
    """Import `module`, then fork a worker per request on the socket `listening` (a descriptor) until the
    launcher closes `control`; READY on `ready` once imported."""
    listener = socket.socket(fileno=listening)
    folder = os.path.dirname(listener.getsockname())
    launcher, server = os.getppid(), None
    try:
        importlib.import_module(module)
        if not _can_fork_workers(module):  # the stand-ins, refused, run their workers themselves
            return
        _forget(module)
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, signal.SIG_IGN)  # meant for the job's processes; the launcher says when to end
        with contextlib.suppress(OSError):
            os.write(ready, READY)
        os.close(ready)
        server = Server(listener, control, module)
        server.loop()
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)  # a launcher killed outright cannot
        # nor its launches' folders; gone (EOF) while the kernel may not yet show it ended, so said here
        scratch.sweep(ended=(launcher,) if server is not None and server.launcher_gone else ())


def _can_fork_workers(module: str) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # a forked child could not use the GPU
        print(f"shoal: {module} started CUDA on import; its workers start on their own", file=sys.stderr)
        return False
    try:  # Linux 5.3 and later: a worker's end is seen without signals or threads
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


def _forget(module: str) -> None:
    """Keep what `module` imported but not the module itself, which each worker runs as `__main__`
    (runpy warns of a module run that is imported already)."""
    del sys.modules[module]
    package, _, name = module.rpartition(".")
    if package:
        with contextlib.suppress(AttributeError):
            delattr(sys.modules[package], name)


class Server:
    """The server's loop: its control pipe, requests on the listener, and per worker its stand-in's
    connection and its pidfd."""

    def __init__(self, listener: socket.socket, control: int, module: str):
        self.listener = listener
        self.control = control
        self.module = module
        self.pid = os.getpid()
        self.serving = True
        self.launcher_gone = False  # its control pipe closed without a word: killed outright
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, self.accept)
        self.selector.register(control, selectors.EVENT_READ, self.told)
        self.workers: dict[int, tuple[socket.socket, int]] = {}  # pid -> (the stand-in's connection, pidfd)

    def loop(self) -> None:
        while self.serving:
            for key, _ in self.selector.select():
                if self.serving:  # not after the launcher's word, in the same round
                    key.data(key.fileobj)

    def told(self, control: int) -> None:
        """The launcher is done (STOP) or gone (EOF): the server ends, and the workers it was told to stop."""
        if os.read(control, 1) == STOP:
            self.kill_workers()
        else:
            self.launcher_gone = True
        self.serving = False

    def accept(self, listener: socket.socket) -> None:
        try:
            connection, _ = listener.accept()
        except OSError:  # out of descriptors, say: the stand-in, refused, runs its worker itself
            return
        try:
            connection.settimeout(REQUEST_SECONDS)
            _check_same_user(connection)
            request, streams = receive_request(connection)
        except (OSError, ValueError, KeyError, TypeError, MemoryError):  # not a stand-in's request
            connection.close()
            return
        try:
            pid = self.fork(request, streams, connection)
        finally:
            for descriptor in streams.values():
                os.close(descriptor)
        if pid is None:
            connection.close()
            return
        try:
            connection.settimeout(None)
            self.watch(pid, connection)
            connection.sendall(NUMBER.pack(pid))
        except OSError:  # the stand-in is gone already, or the worker cannot be watched: it goes
            if pid in self.workers:
                self.abandoned(pid, connection)
            else:  # never watched: killed and reaped here
                signal_worker(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                connection.close()

    def fork(self, request: dict, streams: dict[int, int], connection: socket.socket) -> int | None:
        """The worker's pid once it leads its own process group with the stand-in's signal dispositions (a
        signal passed on before then would miss it); None where no process could be forked."""
        readable, writable = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(readable)
            os.close(writable)
            return None
        if pid == 0:
            os.close(readable)
            self.become_worker(request, streams, connection, writable)
        os.close(writable)
        with contextlib.suppress(OSError):
            os.read(readable, 1)  # its word, or EOF: it died first
        os.close(readable)
        return pid

    def watch(self, pid: int, connection: socket.socket) -> None:
        pidfd = os.pidfd_open(pid)
        self.workers[pid] = (connection, pidfd)
        self.selector.register(connection, selectors.EVENT_READ, lambda _, pid=pid: self.abandoned(pid, connection))
        self.selector.register(pidfd, selectors.EVENT_READ, lambda _, pid=pid: self.ended(pid))

    def abandoned(self, pid: int, connection: socket.socket) -> None:
        """The stand-in closed its end: the agent killed it, so its worker goes too (a stopped one included)."""
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(connection)
        if pid in self.workers:  # not yet reaped, so the pid is still its
            signal_worker(pid, signal.SIGKILL)

    def ended(self, pid: int) -> None:
        if pid not in self.workers:  # reaped already (killed when the launcher said STOP)
            return
        _, status = os.waitpid(pid, 0)
        connection, pidfd = self.workers.pop(pid)
        for watched in (connection, pidfd):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(watched)
        with contextlib.suppress(OSError):
            connection.sendall(NUMBER.pack(os.waitstatus_to_exitcode(status)))
        connection.close()
        os.close(pidfd)

    def kill_workers(self) -> None:
        """SIGKILL every worker left (the launcher gave them their time), and tell each stand-in so."""
        for pid in list(self.workers):
            signal_worker(pid, signal.SIGKILL)
            self.ended(pid)

    def become_worker(self, request: dict, streams: dict[int, int], connection: socket.socket,
                      ready: int) -> None:
        """In the forked child: take the stand-in's streams and the rest, say so on `ready`, then run the module
        as `python -m` would. Never returns: whatever happens, the child must not go back into the server."""
        status = 1
        try:
            try:
                os.setsid()  # a process group of its own, as torch's agent starts its workers
                for number in STREAMS:
                    if number in streams:
                        os.dup2(streams[number], number)
                    else:
                        os.close(number)
                for descriptor in streams.values():
                    os.close(descriptor)
                self._close_server(connection)
                _take_over(request, self.pid)
                os.write(ready, READY)
                os.close(ready)
                status = run_as_main(self.module, request["arguments"])
            except KeyboardInterrupt:
                status = -signal.SIGINT  # as an interpreter ends on an uncaught Ctrl-C
            except BaseException:  # noqa: BLE001
                sys.excepthook(*sys.exc_info())
            _finish()
        finally:
            exit_as(status)

    def _close_server(self, connection: socket.socket) -> None:
        """The child holds none of the server's descriptors, or a stand-in would not see its server end."""
        for other, pidfd in self.workers.values():
            other.close()
            os.close(pidfd)
        connection.close()
        self.selector.close()
        self.listener.close()
        os.close(self.control)


def signal_worker(pid: int, number: int) -> None:
    """Send `number` to the worker `pid`'s process group, as torch's agent signals its workers; to the worker
    alone where that group is gone or not yet made (a child between its fork and its setsid)."""
    try:
        os.killpg(pid, number)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, number)


def _check_same_user(connection: socket.socket) -> None:
    _pid, uid, _gid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                               struct.calcsize("3i")))
    if uid not in (0, os.getuid()):
        raise PermissionError(f"a request from user {uid}")


def _take_over(request: dict, server: int) -> None:
    """The stand-in's folder, environment, import path and signal dispositions, as a fresh process has them."""
    os.chdir(request["folder"])
    os.environ.clear()
    os.environ.update(request["environment"])
    if request["under_launcher"]:  # the server, its parent, ends with the launcher (pid taken before the fork)
        os.environ.update(ShoalLauncher.variables(server))
    sys.path[:] = request["path"]
    for number in FORWARDED:
        default = signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL
        signal.signal(number, signal.SIG_IGN if number in request["ignored"] else default)


def run_as_main(module: str, arguments: list[str]) -> int:
    """Run `module` as `python -m module arguments` would; its exit status."""
    sys.argv = [module, *arguments]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            return (exit.code or 0) & 0xFF  # as the system keeps it: exit(-1) is 255
        print(exit.code, file=sys.stderr)
        return 1
    return 0


def _finish() -> None:
    """What an interpreter does on its way out, short of tearing down its modules: wait for its threads and
    run its exit functions (a share cache's folder is removed by one); exit_as flushes its streams."""
    with contextlib.suppress(Exception):
        threading._shutdown()  # noqa: SLF001 - the interpreter's own step, which os._exit skips
    atexit._run_exitfuncs()  # noqa: SLF001


def exit_as(status: int) -> NoReturn:
    """Exit with `status`, or be killed by the signal -`status`, as the worker was."""
    try:
        flush_output()
        if status < 0:
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the worker dumped its core, if any: not again
                signal.signal(-status, signal.SIG_DFL)  # (SIGKILL has no disposition to reset)
            os.kill(os.getpid(), -status)
            status = 128 - status  # a signal that does not end a process by default
    finally:
        os._exit(status)


# --- the request, as a stand-in sends it and the server reads it -------------------------------------


def send_request(connection: socket.socket, arguments: list[str], under_launcher: bool) -> None:
    request = {"arguments": arguments, "folder": os.getcwd(), "environment": dict(os.environ), "path": sys.path,
               "under_launcher": under_launcher,
               "ignored": [number for number in FORWARDED if signal.getsignal(number) == signal.SIG_IGN]}
    streams = [number for number in STREAMS if _is_open(number)]
    payload = json.dumps({**request, "streams": streams}).encode()
    socket.send_fds(connection, [NUMBER.pack(len(payload))], streams)
    connection.sendall(payload)


def receive_request(connection: socket.socket) -> tuple[dict, dict[int, int]]:
    header, descriptors, _, _ = socket.recv_fds(connection, NUMBER.size, len(STREAMS))
    try:
        header += receive_exactly(connection, NUMBER.size - len(header))
        (length,) = NUMBER.unpack(header)
        if not 0 < length <= LARGEST_REQUEST:
            raise ValueError(f"a request of {length} bytes")
        request = json.loads(receive_exactly(connection, length))
        if len(request["streams"]) != len(descriptors):
            raise ValueError("streams named and passed differ")
    except BaseException:
        for descriptor in descriptors:
            os.close(descriptor)
        raise
    return request, dict(zip(request["streams"], descriptors))


def receive_number(connection: socket.socket) -> int:
    (number,) = NUMBER.unpack(receive_exactly(connection, NUMBER.size))
    return number


def receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the other end closed")
        data += chunk
    return data


def _is_open(descriptor: int) -> bool:
    try:
        os.fstat(descriptor)
    except OSError:
        return False
    return True


if __name__ == "__main__":
    if len(sys.argv) != 5:
        print(f"usage: python -m {MODULE} LISTENING CONTROL READY MODULE (descriptors; started by shoal train)",
              file=sys.stderr)
        sys.exit(2)
    serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    end_process(0)  # no teardown of what it imported (a second, with torch): it ran nothing
