"""Workers forked from a process that has already imported them.

A worker's imports (torch above all) take about 2.5 s of a core, and shoal's launcher imports torch
for its agent before it can start any: a job's first step waited for both, one after the other, and
every restart paid the workers' part again. `shoal train` starts a fork server first thing; it imports
the worker module while the launcher imports torch (on another core where there is one), and each
worker is then forked from it, already imported.

torch's agent still starts and watches one process per worker, a light one:
`python -m shoal.cluster.forkserver run SOCKET shoal.worker ARGS...` hands the server its arguments,
environment, folder and standard streams, passes on the signals it gets, and ends as its worker
ended (the same exit status, or the same signal). Where the server cannot be reached it runs the
worker itself. The server kills a worker whose stand-in is gone (the agent's SIGKILL after its grace
time) and ends with its launcher; its workers then stop as orphans do (shoal.cluster.orphan).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import traceback

from shoal.cluster.orphan import LAUNCHER_VARIABLE, ORPHAN_EXIT, under_shoal_launcher

MODULE = "shoal.cluster.forkserver"
CHECK_SECONDS = 0.5  # how often the server looks for its launcher
BACKLOG = 256  # stand-ins waiting while the server imports: a machine's workers, and more
REQUEST_SECONDS = 10.0  # a stand-in sends its request at once; one that stalls is dropped
# what a stand-in passes on to its worker: what the agent, a terminal or SLURM send
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
NUMBER = struct.Struct("!q")  # a length, a pid or an exit status (negative: the signal that ended it)
STREAMS = (0, 1, 2)

_running: ForkServer | None = None


class ForkServer:
    """A fork server of this process (the launcher), importing `module` from the moment it starts."""

    def __init__(self, module: str):
        self.module = module
        self.folder = tempfile.mkdtemp(prefix="shoal-forkserver-")  # mode 0700: no other user may ask it for workers
        self.path = os.path.join(self.folder, "socket")
        # listening from here on: a stand-in that comes before the server has started waits in the backlog
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(self.path)
            listener.listen(BACKLOG)
            # a session of its own: the terminal's Ctrl-C is the launcher's to pass on, not the server's to die of
            self.process = subprocess.Popen([sys.executable, "-u", "-m", MODULE, "serve", str(listener.fileno()),
                                             module, str(os.getpid())], stdin=subprocess.DEVNULL,
                                            start_new_session=True, pass_fds=[listener.fileno()])

    def arguments(self, worker: list[str]) -> list[str]:
        """The interpreter arguments that start one worker (`worker`: the module's own arguments) from here."""
        return ["-u", "-m", MODULE, "run", self.path, self.module, *worker]

    def close(self) -> None:
        """Stop the server (killing any worker still forked from it) and remove its folder."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def start(module: str) -> ForkServer:
    """Start this process's fork server for `module` (one at a time); the launcher forks its workers from it."""
    global _running
    stop()
    _running = ForkServer(module)
    return _running


def running() -> ForkServer | None:
    return _running


def stop() -> None:
    global _running
    if _running is not None:
        _running.close()
        _running = None


# --- the server --------------------------------------------------------------------------------------


def serve(listening: int, module: str, launcher: int) -> None:
    """Import `module`, then fork a worker per request on the socket `listening` (a descriptor)."""
    listener = socket.socket(fileno=listening)
    path = listener.getsockname()
    importlib.import_module(module)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # a forked child could not use the GPU
        print(f"shoal: {module} started CUDA on import; its workers start on their own", file=sys.stderr)
        return
    _forget(module)
    server = Server(listener, module, launcher)
    signal.signal(signal.SIGTERM, _stop_on_signal)
    try:
        server.loop()  # the launcher gone, its workers stop as orphans (their parent, this server, goes too)
    except _Stopped:  # the launcher is done with its workers: any left have had their time
        server.kill_workers()
    finally:
        server.listener.close()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)  # a launcher killed outright cannot


def _forget(module: str) -> None:
    """Keep what `module` imported but not the module itself, which each worker runs as `__main__`
    (runpy warns of a module run that is imported already)."""
    del sys.modules[module]
    package, _, name = module.rpartition(".")
    if package:
        with contextlib.suppress(AttributeError):
            delattr(sys.modules[package], name)


class _Stopped(Exception):
    pass


def _stop_on_signal(_number, _frame) -> None:
    raise _Stopped


class Server:
    """The server's loop: requests on the listener; per worker, its stand-in's connection and its pidfd."""

    def __init__(self, listener: socket.socket, module: str, launcher: int):
        self.listener = listener
        self.module = module
        self.launcher = launcher
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, self.accept)
        self.workers: dict[int, tuple[socket.socket, int]] = {}  # pid -> (the stand-in's connection, pidfd)

    def loop(self) -> None:
        """Until the launcher is gone; its SIGTERM (_Stopped) lands only while waiting, never halfway through
        forking a worker or reporting one's end."""
        while os.getppid() == self.launcher:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            events = self.selector.select(CHECK_SECONDS)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            for key, _ in events:
                key.data(key.fileobj)

    def accept(self, listener: socket.socket) -> None:
        connection, _ = listener.accept()
        try:
            connection.settimeout(REQUEST_SECONDS)
            _check_same_user(connection)
            request, streams = receive_request(connection)
        except (OSError, ValueError, KeyError, TypeError):  # not a stand-in's request: nothing is started
            connection.close()
            return
        pid = os.fork()
        if pid == 0:
            self.become_worker(request, streams, connection)
        for descriptor in streams.values():
            os.close(descriptor)
        connection.settimeout(None)
        self.watch(pid, connection)
        try:
            connection.sendall(NUMBER.pack(pid))
        except OSError:  # the stand-in is gone already
            self.abandoned(pid, connection)

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
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def ended(self, pid: int) -> None:
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
        """SIGKILL every worker left, and tell each stand-in so."""
        for pid in list(self.workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.ended(pid)

    def become_worker(self, request: dict, streams: dict[int, int], connection: socket.socket) -> None:
        """In the forked child: take the stand-in's streams, folder, environment and signals, then run
        the module as `python -m` would. Never returns."""
        status = 1
        try:
            os.setsid()  # as torch's agent starts its workers
            for number in STREAMS:
                if number in streams:
                    os.dup2(streams[number], number)
                else:
                    os.close(number)
            for descriptor in streams.values():
                os.close(descriptor)
            self._close_server(connection)
            _take_over(request)
            status = run_as_main(self.module, request["arguments"])
        except BaseException:  # noqa: BLE001 - whatever happened, the child must not return into the server
            traceback.print_exc()
        finally:
            _flush()
            os._exit(status)

    def _close_server(self, connection: socket.socket) -> None:
        """The child holds none of the server's descriptors, or a stand-in would not see its server end."""
        for other, pidfd in self.workers.values():
            other.close()
            os.close(pidfd)
        connection.close()
        self.selector.close()
        self.listener.close()


def _check_same_user(connection: socket.socket) -> None:
    _pid, uid, _gid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                               struct.calcsize("3i")))
    if uid not in (0, os.getuid()):
        raise PermissionError(f"a request from user {uid}")


def _take_over(request: dict) -> None:
    """The stand-in's folder, environment, import path and ignored signals, as a fresh process would have them."""
    os.chdir(request["folder"])
    os.environ.clear()
    os.environ.update(request["environment"])
    if request["under_launcher"]:  # the server is the worker's parent now, and ends with the launcher
        os.environ[LAUNCHER_VARIABLE] = str(os.getppid())
    sys.path[:] = request["path"]
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked in the server while it forked
    for number in request["ignored"]:
        signal.signal(number, signal.SIG_IGN)


def run_as_main(module: str, arguments: list[str]) -> int:
    """Run `module` as `python -m module arguments` would; its exit status."""
    sys.argv = [module, *arguments]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            return exit.code or 0
        print(exit.code, file=sys.stderr)
        return 1
    return 0


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


# --- the stand-in --------------------------------------------------------------------------------------


def run(path: str, module: str, arguments: list[str]) -> int:
    """Have the server at `path` fork the worker and stand in for it; without a server, be the worker."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
        send_request(connection, arguments)
        pid = receive_number(connection)
    except OSError:  # no server, or it ended before forking: nothing was started
        connection.close()
        return run_as_main(module, arguments)
    forward_signals(pid)
    try:
        status = receive_number(connection)
    except OSError:  # the server ended (its launcher is gone): the worker stops as an orphan
        status = ORPHAN_EXIT
    end_as(status)
    return status


def send_request(connection: socket.socket, arguments: list[str]) -> None:
    request = {"arguments": arguments, "folder": os.getcwd(), "environment": dict(os.environ), "path": sys.path,
               "under_launcher": under_shoal_launcher(),
               "ignored": [number for number in FORWARDED if signal.getsignal(number) == signal.SIG_IGN]}
    streams = [number for number in STREAMS if _is_open(number)]
    payload = json.dumps({**request, "streams": streams}).encode()
    socket.send_fds(connection, [NUMBER.pack(len(payload))], streams)
    connection.sendall(payload)


def receive_request(connection: socket.socket) -> tuple[dict, dict[int, int]]:
    header, descriptors, _, _ = socket.recv_fds(connection, NUMBER.size, len(STREAMS))
    try:
        header += _receive_exactly(connection, NUMBER.size - len(header))
        (length,) = NUMBER.unpack(header)
        request = json.loads(_receive_exactly(connection, length))
        if len(request["streams"]) != len(descriptors):
            raise ValueError("streams named and passed differ")
    except BaseException:
        for descriptor in descriptors:
            os.close(descriptor)
        raise
    return request, dict(zip(request["streams"], descriptors))


def receive_number(connection: socket.socket) -> int:
    (number,) = NUMBER.unpack(_receive_exactly(connection, NUMBER.size))
    return number


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
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


def forward_signals(pid: int) -> None:
    """What the stand-in is sent, its worker gets (where the stand-in was not told to ignore it)."""
    worker = os.pidfd_open(pid)

    def forward(number, _frame) -> None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(worker, number)

    for number in FORWARDED:
        if signal.getsignal(number) != signal.SIG_IGN:
            signal.signal(number, forward)


def end_as(status: int) -> None:
    """Exit as the worker did: the same status, or killed by the same signal."""
    _flush()
    if status < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        status = 128 - status  # a signal that does not end a process by default
    os._exit(status)


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 4:
        serve(int(argv[1]), argv[2], int(argv[3]))
        _flush()
        os._exit(0)  # no teardown of what it imported (a second, with torch): it ran nothing
    if argv[:1] == ["run"] and len(argv) >= 3:
        return run(argv[1], argv[2], argv[3:])
    print(f"usage: python -m {MODULE} serve DESCRIPTOR MODULE LAUNCHER_PID | run SOCKET MODULE [ARGUMENTS...]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
