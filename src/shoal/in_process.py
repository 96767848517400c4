"""`shoal.fit(..., workers=0)`: the whole job in the caller's process, to debug it; and the caller's objects
read back as given there.

A job's workers are processes of their own, started by a launcher: a `breakpoint()` in the user's step,
transform or model stops in a process with no terminal, and a debugger attached to the caller sees none
of it. With workers=0, fit runs the one worker of a one-worker job itself, in the calling thread, after
the same checks and into the same run directory and events as `workers=1`. One worker joins no process
group, so nothing is started: no launcher, fork server or store. What the worker would change of the
process (torch's thread count, the random generators) is put back.

fit writes the user's objects into the run directory by value, and its own process reads those files too
(the launcher's checks, the model it returns, and with workers=0 the worker). There they read back as the
objects they were written from (`read_as_given`): the user's own step, transform, loss, metrics and
scheduler are called, so breakpoints set in them stop and what they change is the caller's to see; a module
given as the model is copied, as a worker's is. Unpickling them would also rewrite the caller's classes:
cloudpickle gives a class it finds defined already the methods of the file's copy, whose code has no file
and whose globals are a snapshot.
"""

from __future__ import annotations

import bdb
import contextlib
import copy
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

import shoal.code
import shoal.model
from shoal.cluster.env import DistInfo, threads_per_worker
from shoal.errors import ShoalError, UserCodeError, WorkerError, described
from shoal.events import JobEnd, WorkerFailed, append_event
from shoal.fit_inputs import MODEL_FILE
from shoal.jobs import load_job
from shoal.objects import load_object

Loaders = dict[Path, Callable[[str | Path, str], Any]]
"""A file of the run directory (resolved) -> what reading it gives in this process, given its path and key."""


def caller_objects(run_dir: Path, shipped: dict[str, Any]) -> Loaders:
    """How each object fit wrote into `run_dir` (`shipped`, by file name) reads back here: the caller's own code
    itself, but a model (a module, or what the caller's model function returns) as a copy, fresh at every read:
    the checks and the worker each build their own, as each reads its own from the file, and the caller's module
    keeps its weights whatever the job does."""
    def loader(name: str, value: Any) -> Callable[[str | Path, str], Any]:
        if isinstance(value, torch.nn.Module):
            return lambda path, where: fresh(value, path, where)
        if name == MODEL_FILE and callable(value):
            return lambda path, where: (lambda: fresh(value(), path, where))
        return lambda path, where: value

    return {(run_dir / name).resolve(): loader(name, value) for name, value in shipped.items()}


def fresh(value: Any, path: str | Path, where: str) -> Any:
    """A copy of the caller's model; a module that cannot be deep-copied (one holding tensors computed from others,
    such as weight_norm's) is read from the file fit wrote, as a worker reads it."""
    try:
        return copy.deepcopy(value)
    except Exception:  # deepcopy refuses what pickling takes: the file holds the same model
        loaded = load_object(path, where)
        return loaded() if callable(loaded) and not isinstance(loaded, torch.nn.Module) else loaded


@contextlib.contextmanager
def read_as_given(loaders: Loaders) -> Iterator[None]:
    """Meanwhile, the files in `loaders` read as their objects wherever shoal loads a shipped object (the
    model's, and the code's: shoal.model and shoal.code); any other file reads from disk as usual."""
    def load(path: str | Path, where: str) -> Any:
        found = loaders.get(Path(path).resolve())
        return found(path, where) if found is not None else load_object(path, where)

    saved = shoal.code.load_object, shoal.model.load_object
    shoal.code.load_object = shoal.model.load_object = load
    try:
        yield
    finally:
        shoal.code.load_object, shoal.model.load_object = saved


@contextlib.contextmanager
def workers_settings(threads: int) -> Iterator[None]:
    """torch's thread count as a worker sets it, and the random generators it seeds, for the block only: the
    caller's process goes on with its own, as after a job in worker processes."""
    threads_before = torch.get_num_threads()
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        torch.set_num_threads(threads)
        try:
            yield
        finally:
            torch.set_num_threads(threads_before)
            random.setstate(python_state)
            np.random.set_state(numpy_state)


def run(job_file: Path, callbacks: list) -> None:
    """The job in `job_file` (written after the launcher's checks, as for workers) as its one worker, here.

    The user's own exception (raised in a step, transform, metric or callback) reaches the caller as it was
    raised, its traceback leading into the user's code, so a post-mortem debugger stops there; the run's
    events record the job's end as a one-worker job's launcher would."""
    job = load_job(job_file)  # as the worker reads it
    run_dir = Path(job.output.run_dir)
    try:
        train(job, run_dir, callbacks)
    except (Exception, KeyboardInterrupt) as error:
        own = record_end(run_dir, error)
        if own is None:
            raise
    else:
        return
    raise own  # outside the handler: the user's exception carries no context of shoal's


def train(job, run_dir: Path, callbacks: list) -> None:
    """Rank 0 of 1, whatever launcher's variables this process holds: it runs alone (with the caller's objects,
    as fit reads them meanwhile: `read_as_given`)."""
    from shoal.train.runner import Runner  # the training loop: only for a job run here, not for every fit

    threads = threads_per_worker(job.cluster.threads, 1)
    runner = Runner(job, DistInfo(), run_dir, threads, callbacks=callbacks)  # no stall judge: a debugger waits
    try:
        with workers_settings(threads):
            runner.run()
    finally:
        if runner.heartbeat is not None:  # a worker's process ends with its beats; this one goes on
            runner.heartbeat.close()


def record_end(run_dir: Path, error: BaseException) -> BaseException | None:
    """Record the job's end as a one-worker job's launcher would: interrupted (Ctrl-C, or the debugger's quit)
    or failed. Returns the user's own exception that `error` carries (a UserCodeError's cause), noted with
    where shoal called the user's code, or None."""
    own = error.__cause__ if isinstance(error, UserCodeError) else None
    if isinstance(error, KeyboardInterrupt) or isinstance(own or error, bdb.BdbQuit):
        how = "SIGINT" if isinstance(error, KeyboardInterrupt) else "quitting the debugger"
        append_event(run_dir, JobEnd(status="interrupted", message=f"stopped by {how}"))
    else:
        record_failure(run_dir, error)
    if own is not None:
        own.add_note(f"shoal.fit(workers=0): {error} (the run's events: {run_dir})")
    return own


def record_failure(run_dir: Path, error: BaseException) -> None:
    """What a one-worker job's launcher records of its worker's failure: the cause, then the job's end."""
    message = described(error)
    host = DistInfo().host
    exit_code = error.exit_code if isinstance(error, (ShoalError, WorkerError)) else 1
    append_event(run_dir, WorkerFailed(rank=0, host=host, exit_code=exit_code, message=message))
    traceback = shoal.code.user_traceback(error, shoal.code.TRACEBACK_LINES)
    append_event(run_dir, JobEnd(status="failed", message=f"worker rank 0 on {host} failed: {message}",
                                 traceback=traceback))
