"""The user-facing error family, a job's failure, and a worker's failure that only followed another's.

Anything a user can fix (a bad job file, a missing dataset, a malformed input line) raises a
`ShoalError`; the command line prints its one-line message and exits with status 2, without a
traceback. A job that failed (a worker, or the machines' meeting) raises a `WorkerError`: one line
too, exit status 1, but not the user's input. A worker that stops only because another went away
or went quiet raises `PeerLost`, so that its launcher looks for the cause elsewhere. Everything else
is a bug or an environment failure and keeps its traceback.
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
    except (ShoalError, WorkerError, PeerLost):
        raise
    except Exception as error:  # whatever the user's code raises
        raise UserCodeError(f"{where}: {described(error)}") from error


TORCH_TIMED_OUT = "timed out"
"""What torch's collectives (gloo's) say when a peer went quiet for cluster.timeout."""
TORCH_LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "remote process exited", "Broken pipe",
                   "communicator was aborted", "NCCL communicator", "DistBackendError", TORCH_TIMED_OUT)
"""torch's (gloo's, NCCL's) own words for a peer gone or gone quiet: never shoal's, which raises `PeerLost`."""


def torch_says(message: str, words: str | tuple[str, ...] = TORCH_LOST_PEER) -> bool:
    """Whether torch's error `message` holds `words` (by default any of torch's words for a lost peer).

    torch raises a plain RuntimeError when a peer goes away, so only its text tells it from another
    RuntimeError: this is the one place where shoal reads an error's text, and only torch's wording.
    shoal's own failures are told apart by type (`PeerLost`, `lost_peer`), or, once they crossed a
    process boundary, by the field their record carries (shoal.worker.record_failure)."""
    said = message.lower()
    return any(text.lower() in said for text in ((words,) if isinstance(words, str) else words))


class PeerLost(RuntimeError):
    """This worker stops only because another went away or went quiet (its message names that one when the
    heartbeats tell it): a consequence, not the cause. A RuntimeError, as torch's own errors of a lost peer."""


CONSEQUENCE = "consequence"
"""The entry of a worker's error file (beside torch's `message`) that says whether its error was `lost_peer`'s:
written by shoal.worker, which has the error itself, and read by its launcher, which has only the record."""


def lost_peer(error: BaseException) -> bool:
    """Whether `error` only says that another worker went away or went quiet: a consequence, not the cause. By
    type; torch's own RuntimeErrors, which shoal cannot type, by their text (`torch_says`)."""
    if isinstance(error, PeerLost):
        return True
    if isinstance(error, UserCodeError) and error.__cause__ is not None:  # torch's error inside the user's step
        return lost_peer(error.__cause__)
    # torch's DistBackendError says its kind in its type's name only, as the record's message writes it
    return isinstance(error, RuntimeError) and torch_says(f"{type(error).__name__}: {error}")


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


class WorkerError(Exception):
    """A job failed: one of its worker processes (the message names its rank and host), or its machines could
    not meet. Not the user's input (not a ShoalError, though the command line prints it as one line too): its
    exit status is 1, or 2 where the worker it names failed on a user error."""

    exit_code = 1
    failure = None
    """The root cause as a `shoal.events.WorkerFailed`, when the launcher found one."""
    consequence = False
    """The workers here only failed because something failed elsewhere (another node holds the cause)."""
