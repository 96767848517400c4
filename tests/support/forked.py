"""A module the fork server tests run as a worker: it says what it was given, then does as told.

`python -m tests.support.forked ACTION [STATUS]`: ACTION is `exit` (with STATUS), `kill` (SIGKILL
itself), `stop` (SIGSTOP itself), `term` (wait for SIGTERM, then exit 5), `sleep`, `family` (start
a child in its process group, say its pid, and sleep), `raise` (an uncaught error, after registering
an exit function) or `interrupt` (an uncaught KeyboardInterrupt).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import time

from shoal.cluster.environments import ShoalLauncher, detect
from shoal.cluster.orphan import end_with_parent


def report(**more) -> None:
    print(json.dumps({"name": __name__, "arguments": sys.argv[1:], "pid": os.getpid(), "parent": os.getppid(),
                      "folder": os.getcwd(), "marker": os.environ.get("FORKED_MARKER"),
                      "under_launcher": isinstance(detect(os.environ), ShoalLauncher),
                      "hangup_ignored": signal.getsignal(signal.SIGHUP) == signal.SIG_IGN, **more}), flush=True)


def main(action: str) -> int:
    launcher = detect(os.environ)
    end_with_parent(0.1, launcher=launcher.launcher_pid() if launcher else None)  # as shoal.worker does
    if action == "term":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(5))
    if action == "family":
        report(child=subprocess.Popen(["sleep", "60"]).pid)
    else:
        report()
    if action == "exit":
        return int(sys.argv[2])
    if action in ("kill", "stop"):
        os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)
    if action == "raise":
        atexit.register(print, "exit functions ran", flush=True)
        raise RuntimeError("raised on purpose")
    if action == "interrupt":
        raise KeyboardInterrupt
    if action in ("term", "sleep", "stop", "family"):
        time.sleep(60)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
