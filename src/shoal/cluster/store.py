"""torch's TCPStore, bound to one address and waited on without blocking signals.

A TCPStore server listens on every interface, and its clients block inside C++ while they
wait, where Ctrl-C and SIGTERM are not seen; over a cut link (no packet answered or refused) a
request never returns at all. shoal's launchers hold their job's store on the one address the
other machines reach (127.0.0.1 for a single machine) by handing torch a socket bound there,
send every request of their own from a helper thread with a deadline, and wait on keys in short
polls, so a signal or a lost machine stops them within seconds.

Nor does a TCPStore ask who connects: anyone who reaches its port may list, read, set and delete
every key. A job's own keys live under names only its secret computes, and every value the job acts
on carries an HMAC of the job's secret over (the job's instance, the key, the value) (`Sealed`): a
stranger who reads a value learns nothing it can use, and a forged value, one moved to another key or
replayed from another job is not believed: the job acts as if it were not there (a stranger can
delete or spoil keys and so stop a job, never steer it). torch's own process-group keys (gloo's
addresses, device claims) get the same seal (`Authenticated`, a torch Store of its own). Counters
(`add`) cannot be sealed: the job uses them only for arrival numbers and launchers' beats.

Every client of the job's store is built here (`serve`, `connect`, `client`); every key it holds is
named in shoal.cluster.keys.
"""

from __future__ import annotations

import hmac
import os
import socket
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from shoal.cluster import keys
from shoal.data.source import SECRET_VARIABLE  # noqa: F401 (re-exported)
from shoal.errors import WorkerError, first_line
from shoal.keyed import derived_key, framed_mac

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
CONTEXT_VARIABLE = "SHOAL_STORE_CONTEXT"
"""What the workers' seals are bound to (the job's instance and the attempt): not secret, only fresh."""
VALUE_LABEL = b"shoal store values v1"
MAC_BYTES = 64  # hex digits of an HMAC-SHA256


class Forged(WorkerError):
    """A value in the job's store that the job's secret did not make: a stranger's, moved or replayed."""


NAME_LABEL = b"shoal store names v1"


def secret_name(secret: str, key: str) -> str:
    """The store's name for `key` in the job holding `secret`: nothing about the key or the secret shows. Names
    come from a key of their own, so no name can stand for another use of the secret (the seals, the data)."""
    return "shoal-" + framed_mac(derived_key(secret, NAME_LABEL), key.encode()).hex()[:40]


class Seal:
    """The MAC every value of the job carries: HMAC-SHA256 under a key derived from the job's secret, over the
    job's `context` (its instance, and the attempt for the workers' store), the key and the value, each
    length-prefixed so no two triples read alike. The secret itself stays in this object."""

    def __init__(self, secret: str, context: str = ""):
        self._secret = secret
        self._key = derived_key(secret, VALUE_LABEL)
        self.context = context
        self._warned: set[str] = set()

    def name(self, key: str) -> str:
        return secret_name(self._secret, key)

    def mac(self, key: str, value: bytes) -> bytes:
        return framed_mac(self._key, self.context.encode(), key.encode(), value).hex().encode()

    def seal(self, key: str, value) -> bytes:
        value = value if isinstance(value, bytes) else str(value).encode()
        return self.mac(key, value) + value

    def open(self, key: str, raw: bytes) -> bytes | None:
        """The value `raw` carries under `key`, or None (said once per key) when the secret did not make it here."""
        raw = bytes(raw)
        value = raw[MAC_BYTES:]
        if len(raw) >= MAC_BYTES and hmac.compare_digest(raw[:MAC_BYTES], self.mac(key, value)):
            return value
        if key not in self._warned:
            self._warned.add(key)
            print(f"shoal: warning: the job's store holds a value for {key!r} that the job's secret did not make: "
                  "ignored (a process without the secret reaches the store)", file=sys.stderr, flush=True)
        return None

    def opened(self, key: str, raw: bytes) -> bytes:
        value = self.open(key, raw)
        if value is None:
            raise Forged(f"the job's store holds a forged value for {key!r} (a process without the job's secret "
                         "reaches the store)")
        return value


class Sealed:
    """The job's keys in a store anyone may reach: named by the job's secret, every value sealed by it. A value
    that fails its seal reads as absent (`check`), or raises Forged where it was known to be there."""

    def __init__(self, store, secret: str, context: str = ""):
        self.store, self.seal = store, Seal(secret, context)

    def name(self, key: str) -> str:
        return self.seal.name(key)

    @property
    def port(self) -> int:
        return self.store.port

    def set(self, key: str, value) -> None:
        self.store.set(self.name(key), self.seal.seal(key, value))

    def get(self, key: str) -> bytes:
        return self.seal.opened(key, self.store.get(self.name(key)))

    def check(self, keys: list[str]) -> bool:
        """Whether every key holds a value the job made."""
        names = [self.name(key) for key in keys]
        if not self.store.check(names):
            return False
        raws = self.store.multi_get(names)
        return all(self.seal.open(key, raw) is not None for key, raw in zip(keys, raws))

    def forged(self, key: str) -> bool:
        """Whether `key` holds a value the job's secret did not make (said once, as `check` says it)."""
        name = self.name(key)
        return self.store.check([name]) and self.seal.open(key, self.store.get(name)) is None

    def compare_set(self, key: str, expected, desired) -> bytes:
        """Set `key` to `desired` unless it holds a value the job made (`expected` must be "": the only use);
        returns the value it holds then. A forged value is replaced."""
        if expected not in ("", b""):
            raise ValueError("Sealed.compare_set only sets a key that holds no value of the job's")
        name = self.name(key)
        raw = self.store.get(name) if self.store.check([name]) else b""
        if raw and self.seal.open(key, raw) is not None:
            return self.seal.opened(key, raw)
        return self.seal.opened(key, self.store.compare_set(name, raw, self.seal.seal(key, desired)))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        raws = self.store.multi_get([self.name(key) for key in keys])
        return [self.seal.opened(key, raw) for key, raw in zip(keys, raws)]

    def add(self, key: str, amount: int) -> int:
        return self.store.add(self.name(key), amount)


_HELD: list = []
"""Every Authenticated store made in this process (a few: one per process group)."""


class Authenticated(dist.Store):
    """torch's own keys (gloo's addresses, device claims) under the job's seal: a torch Store that torch's process
    group uses as any other, whose values the job's secret made, or Forged (the join fails with shoal's message,
    not a stranger's peer address)."""

    def __init__(self, store: dist.Store, seal: Seal):
        super().__init__()
        self.inner, self.seal = store, seal
        _HELD.append(self)  # torch's C++ stores hold only the C++ half: the Python half must outlive them

    def set(self, key, value) -> None:
        self.inner.set(key, self.seal.seal(key, value if isinstance(value, (bytes, str)) else bytes(value)))

    def get(self, key) -> bytes:
        return self.seal.opened(key, self.inner.get(key))

    def multi_get(self, keys) -> list[bytes]:
        return [self.seal.opened(key, raw) for key, raw in zip(keys, self.inner.multi_get(keys))]

    def multi_set(self, keys, values) -> None:
        self.inner.multi_set(keys, [self.seal.seal(key, value) for key, value in zip(keys, values)])

    def add(self, key, amount) -> int:
        return self.inner.add(key, amount)

    def compare_set(self, key, expected, desired) -> bytes:
        """As torch's: `desired` when the key holds `expected` ("": none), sealed both ways (a seal is the same
        bytes for the same key and value, so the sealed `expected` is what the store holds)."""
        raw_expected = b"" if expected in ("", b"") else self.seal.seal(key, expected)
        raw = self.inner.compare_set(key, raw_expected, self.seal.seal(key, desired))
        return self.seal.opened(key, raw) if raw else b""

    def wait(self, keys, timeout=None) -> None:
        self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def check(self, keys) -> bool:
        return self.inner.check(keys)

    def delete_key(self, key) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout) -> None:
        self.inner.set_timeout(timeout)

    @property
    def timeout(self):
        return self.inner.timeout


def group_store(store: dist.Store, secret: str, context: str = "") -> dist.Store:
    """The process group's own keys (torch names them itself) under a prefix only the secret computes, their
    values sealed."""
    seal = Seal(secret, context)
    return Authenticated(dist.PrefixStore(seal.name(keys.PROCESS_GROUP), store), seal)


def worker_secret(environ=os.environ) -> str | None:
    """The secret shoal's launcher handed this worker, if it was started by one."""
    return environ.get(SECRET_VARIABLE) or None


def worker_context(environ=os.environ) -> str:
    """What this worker's seals are bound to: its launcher's job instance and attempt."""
    return environ.get(CONTEXT_VARIABLE, "")


def worker_sealed(store, environ=os.environ):
    """`store` under the job's secret and seals, when shoal's launcher handed this worker one; else as it is."""
    secret = worker_secret(environ)
    return Sealed(store, secret, worker_context(environ)) if secret else store


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

