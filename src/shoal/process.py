"""Ending a shoal process once its work is done and written, and a worker's last words written whole.

With torch loaded, the interpreter's own teardown takes about a second (every module and C++
object is finalized), and a thread torch left running can abort it ("terminate called without
an active exception") after a job has finished well. Every job pays that in each worker and in
the launcher, and a scaling study pays it per trial. shoal's files are closed explicitly before
this point, so the process flushes its streams and leaves at once.
"""

from __future__ import annotations

import logging
import os
import sys


def say(line: str) -> None:
    """Write `line` and its newline to standard error in one call, flushed. print() writes the two apart: a worker
    that its launcher ends between them leaves a line without its end, and the launcher's next line joins it."""
    try:
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed or broken pipe: nothing more can be written anyway
        pass


def flush_output() -> None:
    """Flush standard output and standard error, as far as they still can be."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be written anyway
            pass


def end_process(status: int) -> None:
    """Flush standard output, standard error and logging, then exit with `status` without teardown."""
    flush_output()
    logging.shutdown()
    os._exit(status)
