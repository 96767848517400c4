"""The user-facing error family.

Anything a user can fix (a bad job file, a missing dataset, a malformed input line) raises a
`ShoalError`; the command line prints its one-line message and exits with status 2, without a
traceback. Everything else is a bug or an environment failure and keeps its traceback.
"""

import contextlib

EXIT_USAGE = 2


def first_line(error: BaseException) -> str:
    """An exception in one line: its message's first line, or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__



def described(error: BaseException) -> str:
    """An exception as `Type: its message's first line` (`Type: Type` when it has no message)."""
    return f"{type(error).__name__}: {first_line(error)}"


@contextlib.contextmanager
def blamed(where: str):
    """Whatever the user's code raises inside, as one line naming `where` (a key, a callback's hook), its
    traceback kept as the cause; shoal's own errors pass as they are."""
    try:
        yield
    except ShoalError:
        raise
    except Exception as error:  # whatever the user's code raises
        raise UserCodeError(f"{where}: {described(error)}") from error

LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "remote process exited", "Broken pipe",
             "communicator was aborted", "NCCL communicator", "DistBackendError", "timed out", "waited for it")


def lost_peer(message: str) -> bool:
    """A worker's error that only says another worker went away or went quiet: a consequence, not the cause."""
    return any(text.lower() in message.lower() for text in LOST_PEER)


class ShoalError(Exception):
    """A problem with the user's input, described in one line that names the culprit."""

    exit_code = EXIT_USAGE


class UserCodeError(ShoalError):
    """The user's own code (a step, transform, metric or callback) raised: one line naming where, the user's
    traceback kept as the cause, and printed where the line is (a worker's stderr), to debug by."""


class ConfigError(ShoalError):
    """A job file or override names an unknown key or holds a bad value."""


class DataError(ShoalError):
    """A dataset or an import source is missing, malformed or inconsistent."""


class StoreError(DataError):
    """A read from a dataset store kept failing in a way that may pass (a dropped connection, throttling):
    the data is not at fault, so a job with restarts left restarts for it as for a lost machine."""

    exit_code = 1


class WorkerError(ShoalError):
    """A worker process of a job failed; the message names its rank and host."""

    exit_code = 1
    failure = None
    """The root cause as a `shoal.events.WorkerFailed`, when the launcher found one."""
    consequence = False
    """The workers here only failed because something failed elsewhere (another node holds the cause)."""
