"""A joining machine learns the job's instance by challenge and answer (shoal.cluster.node.greeting): real stores
on loopback, a real Greeter thread, and a stranger that replays a whole earlier job's store into a new one."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from shoal.cluster.node.greeting import HELLO_NEXT, Greeter, greet, hello, welcome
from shoal.cluster.store import Sealed, serve
from shoal.errors import WorkerError

SECRET = "0123456789abcdef0123456789abcdef"

pytestmark = pytest.mark.timeout(60)
HANG = 3600.0
"""greet's deadline where an answer must come: only a guard (the test's timeout ends a hang first); the leader
answers within one poll."""


def recorded(server) -> dict[str, bytes]:
    """Everything a stranger reads from a store."""
    stranger = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False)
    return {key: stranger.get(key) for key in stranger.list_keys()}


def test_a_joining_machine_gets_the_live_instance_even_after_an_earlier_job_s_store_is_played_into_this_one():
    earlier_store, store = serve("127.0.0.1"), serve("127.0.0.1")
    earlier = Greeter(Sealed(earlier_store, SECRET), "the earlier job")
    live = None
    try:
        assert greet(Sealed(earlier_store, SECRET), time.monotonic() + HANG, "here") == "the earlier job"
        live = Greeter(Sealed(store, SECRET), "this job")
        stranger = dist.TCPStore("127.0.0.1", store.port, is_master=False, wait_for_workers=False)
        for key, value in recorded(earlier_store).items():  # the same secret: the same names
            stranger.set(key, value)
        assert greet(Sealed(store, SECRET), time.monotonic() + HANG, "here") == "this job"
    finally:
        earlier.stop()
        if live is not None:
            live.stop()


def test_a_stranger_s_hello_gets_no_answer_and_no_answer_comes_without_the_leader():
    store = serve("127.0.0.1")
    greeter = Greeter(Sealed(store, SECRET), "this job")
    sealed = Sealed(store, SECRET)
    try:
        stranger = dist.TCPStore("127.0.0.1", store.port, is_master=False, wait_for_workers=False)
        number = stranger.add(sealed.name(HELLO_NEXT), 1)
        stranger.set(sealed.name(hello(number)), "a nonce of its own")
        assert greet(sealed, time.monotonic() + HANG, "here") == "this job"  # the next number is answered
        assert not sealed.check([welcome(number)])
    finally:
        greeter.stop()
    with pytest.raises(WorkerError, match=r"^the first machine at here did not answer this machine's greeting"):
        greet(Sealed(serve("127.0.0.1"), SECRET), time.monotonic() + 0.5, "here")
