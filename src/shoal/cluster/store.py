"""torch's TCPStore, bound to one address and waited on without blocking signals.

A TCPStore server listens on every interface, and its clients block inside C++ while they
wait, where Ctrl-C and SIGTERM are not seen; over a cut link (no packet answered or refused) a
request never returns at all. shoal's launchers hold their job's store on the one address the
other machines reach (127.0.0.1 for a single machine) by handing torch a socket bound there,
send every request of their own from a helper thread with a deadline, and wait on keys in short
polls, so a signal or a lost machine stops them within seconds.

Nor does a TCPStore ask who connects, and it lists its keys to anyone: a job's own keys live under
names that only its secret computes (`Sealed`: an HMAC of each name), so that a process without the
secret can neither find nor set the keys the job acts on ("end", a failure flag, a decision).

Every client of the job's store is built here (`serve`, `connect`, `client`); every key it holds is
named in shoal.cluster.keys.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from shoal.cluster import keys
from shoal.data.source import SECRET_VARIABLE  # noqa: F401 (re-exported)
from shoal.errors import WorkerError, first_line

REQUEST_SECONDS = 5.0  # one store request; a cut link shows up within this
POLL_SECONDS = 0.2


class StoreUnreachable(WorkerError):
    """The job's store (on the first machine's launcher) cannot be reached."""


STORE_ERRORS = (RuntimeError, ValueError, StoreUnreachable)
"""What a request to the store raises when the store is gone or out of reach (torch's are RuntimeErrors)."""


def serve(address: str, port: int = 0) -> dist.TCPStore:
    """A store server listening on `address` only ("" or "0.0.0.0": every interface); port 0 picks one."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((address, port))
        listener.listen(128)
        store = dist.TCPStore(address or "0.0.0.0", listener.getsockname()[1], is_master=True,
                              master_listen_fd=listener.fileno(), wait_for_workers=False,
                              timeout=timedelta(seconds=REQUEST_SECONDS))
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the server owns the socket now, and closes it
    return store


def client(address: str, port: int, seconds: float = REQUEST_SECONDS) -> dist.TCPStore:
    """A plain client of the store at address:port whose requests wait at most `seconds` (torch's own)."""
    return dist.TCPStore(address, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=seconds))


def connect(address: str, port: int, deadline: float, what: str) -> Bounded:
    """A client of the store at address:port, tried until `deadline` (time.monotonic); `Sealed` around it
    for the job's own keys."""
    while True:
        try:  # a plain connect first: torch's own retries overrun the deadline and print stack traces
            socket.create_connection((address, port), timeout=REQUEST_SECONDS).close()
            return Bounded(client(address, port))
        except (OSError, RuntimeError, ValueError) as error:
            if time.monotonic() >= deadline:
                raise StoreUnreachable(f"could not reach {what} at {address}:{port}: {first_line(error)}") from None
            time.sleep(POLL_SECONDS)


class Bounded:
    """A store whose every request gets REQUEST_SECONDS: past that, StoreUnreachable. The request is left
    to a daemon thread, which cannot keep the process from exiting, and the store counts as lost."""

    def __init__(self, store: dist.Store, seconds: float = REQUEST_SECONDS):
        self.raw, self.seconds = store, seconds
        self.lost = False

    def __getattr__(self, name: str):
        method = getattr(self.raw, name)
        if not callable(method):
            return method

        def bounded(*arguments):
            if self.lost:
                raise StoreUnreachable("the job's store stopped answering")
            outcome: list = []
            request = threading.Thread(target=_call, args=(method, arguments, outcome), daemon=True,
                                       name="shoal-store-request")
            request.start()
            request.join(self.seconds)
            if not outcome:
                self.lost = True
                raise StoreUnreachable(f"no answer from the job's store within {self.seconds:g} s")
            value, error = outcome[0]
            if error is not None:
                raise error
            return value

        return bounded


def _call(method, arguments: tuple, outcome: list) -> None:
    try:
        outcome.append((method(*arguments), None))
    except BaseException as error:  # handed to the caller's thread
        outcome.append((None, error))


# the job's secret in the workers' environment (never on a command line): one name, kept with the data
# reader that also needs it on machines that stream their share


def secret_name(secret: str, key: str) -> str:
    """The store's name for `key` in the job holding `secret`: nothing about the key or the secret shows."""
    return "shoal-" + hmac.new(secret.encode(), key.encode(), hashlib.sha256).hexdigest()[:40]


class Sealed:
    """The job's keys in a store anyone may reach, under names only the job's secret computes."""

    def __init__(self, store, secret: str):
        self.store, self.secret = store, secret

    def name(self, key: str) -> str:
        return secret_name(self.secret, key)

    @property
    def port(self) -> int:
        return self.store.port

    def set(self, key: str, value) -> None:
        self.store.set(self.name(key), value)

    def get(self, key: str) -> bytes:
        return self.store.get(self.name(key))

    def check(self, keys: list[str]) -> bool:
        return self.store.check([self.name(key) for key in keys])

    def compare_set(self, key: str, expected, desired) -> bytes:
        return self.store.compare_set(self.name(key), expected, desired)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self.store.multi_get([self.name(key) for key in keys])

    def add(self, key: str, amount: int) -> int:
        return self.store.add(self.name(key), amount)


def group_store(store: dist.Store, secret: str) -> dist.Store:
    """The process group's own keys (torch names them itself) under a prefix only the secret computes."""
    return dist.PrefixStore(secret_name(secret, keys.PROCESS_GROUP), store)


def worker_secret(environ=os.environ) -> str | None:
    """The secret shoal's launcher handed this worker, if it was started by one."""
    return environ.get(SECRET_VARIABLE) or None


def wait_for(store: dist.Store, keys: list[str], deadline: float) -> list[str]:
    """Poll until every key exists or `deadline` passes; returns the keys still missing."""
    while True:
        missing = [key for key in keys if not store.check([key])]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(POLL_SECONDS)


def attempt_store(store: dist.Store, attempt: int) -> dist.Store:
    """The keys of one attempt in a store kept across restarts (torchrun's): an earlier attempt's beats,
    verdict or process group must not speak for this one. Attempt 0 uses the store as it is."""
    return dist.PrefixStore(keys.attempt_prefix(attempt), store) if attempt else store

