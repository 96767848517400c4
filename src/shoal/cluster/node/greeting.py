"""A machine that joins learns the job's live instance by challenge and answer, never from a stored value.

Every value of a job is sealed over its instance (shoal.cluster.store.Sealed), a random word the first
machine's launcher draws; a machine that joins must learn it. Read from the store it could be one recorded
from an earlier job with the same secret (a secret file is reused from job to job) and written back by
anyone who reaches the store: the machine would then believe all of that job's recorded values. So it
asks: it takes a number (`hello/next`), leaves a fresh random nonce under `hello/N`, sealed with the secret,
and waits for `welcome/N`, which only the leader's `Greeter` writes: the nonce and the instance, sealed. An
answer that does not carry its own nonce was not made for it, and is not believed. Counters carry no seal,
so a stranger may draw numbers: the leader answers only the latest `PENDING` numbers it has not answered.
"""

from __future__ import annotations

import secrets
import threading
import time

from shoal.cluster import store as stores
from shoal.errors import WorkerError

HELLO_NEXT = "hello/next"
PENDING = 64
"""The most numbers the leader keeps asking about: the newest ones (a stranger may draw many)."""


def hello(number: int) -> str:
    return f"hello/{number}"


def welcome(number: int) -> str:
    return f"welcome/{number}"


class Greeter:
    """The leader's answers to joining machines, from a thread of its own for as long as the job's store is up."""

    def __init__(self, store: stores.Sealed, instance: str):
        """`store`: the job's store sealed without an instance (the joining machine knows none yet)."""
        self.store, self.instance = store, instance
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="shoal-greeter")
        self._thread.start()

    def _run(self) -> None:
        answered, pending = 0, []
        while not self._stop.wait(stores.POLL_SECONDS):
            try:
                last = int(self.store.add(HELLO_NEXT, 0))
                pending = (pending + list(range(answered + 1, last + 1)))[-PENDING:]
                answered = max(answered, last)
                pending = [number for number in pending if not self._answer(number)]
            except stores.STORE_ERRORS:
                return  # the store is gone: so is the job

    def _answer(self, number: int) -> bool:
        """Answer `hello/number` if a machine holding the secret left its nonce there; whether it was answered."""
        if not self.store.check([hello(number)]):
            return False
        nonce = self.store.get(hello(number)).decode()
        self.store.set(welcome(number), f"{nonce} {self.instance}")
        return True

    def stop(self) -> None:
        """Stop answering; waits for a request in flight (a thread left inside the store's C++ client as the
        process ends would abort it)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(stores.REQUEST_SECONDS)


def greet(store: stores.Sealed, deadline: float, where: str) -> str:
    """The job's instance, as the leader tells this machine in answer to a fresh nonce; WorkerError when no
    answer made for it comes by `deadline` (time.monotonic)."""
    number, nonce = int(store.add(HELLO_NEXT, 1)), secrets.token_hex(16)
    store.set(hello(number), nonce)
    while True:
        if store.check([welcome(number)]):
            answered, _, instance = store.get(welcome(number)).decode().partition(" ")
            if answered == nonce and instance:
                return instance
        if time.monotonic() >= deadline:
            raise WorkerError(f"the first machine at {where} did not answer this machine's greeting in time: is its "
                              "launcher running?")
        time.sleep(stores.POLL_SECONDS)
