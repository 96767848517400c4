"""One worker's stand-in: the process torch's agent starts and watches in the worker's place.

`python -m shoal.cluster.node.standin SOCKET MODULE ARGUMENTS...` imports nothing heavy. It asks the fork
server at SOCKET (shoal.cluster.node.forkserver) for a worker running MODULE with its arguments, folder,
environment and standard streams; passes on to the worker's process group the signals it is sent
(torch's agent signals its workers' groups); and ends as the worker ended, with the same exit status
or killed by the same signal, so the agent sees the worker's own end. Where the server cannot be
reached, it is the worker itself.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys

from shoal.cluster.environments import detect
from shoal.cluster.node.forkserver import FORWARDED, exit_as, receive_number, run_as_main, send_request, signal_worker
from shoal.cluster.orphan import ORPHAN_EXIT

ORPHAN_SECONDS = 5.0  # a worker whose server ended stops within a second or so (shoal.cluster.orphan)


def stand_in(path: str, module: str, arguments: list[str]) -> int:
    """Have the server at `path` fork the worker and stand in for it; without a server, be the worker."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
        environment = detect(os.environ)  # the worker ends with the server where it would with the launcher
        send_request(connection, arguments, environment is not None and environment.worker_ends_with_server())
        pid = receive_number(connection)
    except OSError:  # no server, or it ended before forking: nothing was started
        connection.close()
        return run_as_main(module, arguments)
    forward_signals(pid)
    try:
        status = receive_number(connection)
    except OSError:  # the server ended first (its launcher is gone)
        status = outlived(pid)
    exit_as(status)


def forward_signals(pid: int) -> None:
    """What the stand-in is sent (and was not told to ignore), the worker's process group gets."""
    for number in FORWARDED:
        if signal.getsignal(number) != signal.SIG_IGN:
            signal.signal(number, lambda number, _frame: signal_worker(pid, number))


def outlived(pid: int) -> int:
    """Wait for a worker whose server ended to stop as an orphan, killing it after ORPHAN_SECONDS: nothing
    of it outlives its stand-in, which the agent may start again at once."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # gone already
        return ORPHAN_EXIT
    try:
        ready, _, _ = select.select([pidfd], [], [], ORPHAN_SECONDS)
        if not ready:
            signal_worker(pid, signal.SIGKILL)
            select.select([pidfd], [], [], ORPHAN_SECONDS)
    finally:
        os.close(pidfd)
    return ORPHAN_EXIT


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print("usage: python -m shoal.cluster.node.standin SOCKET MODULE [ARGUMENTS...] (started by shoal train)",
              file=sys.stderr)
        sys.exit(2)
    sys.exit(stand_in(sys.argv[1], sys.argv[2], sys.argv[3:]))
