"""Reads from a dataset store, tried again when they fail in a way that may pass.

An object store or HDFS drops a connection or throttles now and then; pyarrow reports it as a
plain `OSError`. Failing the job for it (a data error, exit status 2, never retried) turns a
moment's hiccup into a lost job, so a read is tried `TRIES` times, pausing 0.5 s then 1 s. A
missing file, a refused permission or a folder where a file should be will not change on a
second look and fail at once. After the last try the error is a `StoreError`, a `DataError` that
says it may be transient and that a restart may cure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from shoal.errors import StoreError, first_line

TRIES = 3
FIRST_PAUSE = 0.5  # seconds; doubled after each failure
LASTING = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)

Result = TypeVar("Result")


def transient(error: BaseException) -> bool:
    """An error a later try may not meet: an OSError that is not about the path itself."""
    return isinstance(error, OSError) and not isinstance(error, LASTING)


def pause(failures: int) -> None:
    """Wait before the next try, after `failures` failed ones: 0.5 s, 1 s, ..."""
    time.sleep(FIRST_PAUSE * 2 ** (failures - 1))


def gave_up(where: str, error: BaseException) -> StoreError:
    return StoreError(f"{where}: store read failed {TRIES} times ({first_line(error)}); "
                     "this may be transient: run again")


def after_failure(error: OSError, failures: int, where: str) -> int:
    """Count one more transient failure of a read: pause before the next try and return the count,
    or raise a `StoreError` naming `where` once `TRIES` reads have failed."""
    failures += 1
    if failures >= TRIES:
        raise gave_up(where, error) from None
    pause(failures)
    return failures


def retried(read: Callable[[], Result], where: str) -> Result:
    """`read()`, tried again after a pause while it fails transiently; a `StoreError` naming `where`
    once it has failed `TRIES` times. Any other error passes through unchanged."""
    failures = 0
    while True:
        try:
            return read()
        except OSError as error:
            if not transient(error):
                raise
            failures = after_failure(error, failures, where)
