"""The job's store: a server on one address only, clients that retry up to a deadline, waits that poll.

A launcher's store must not listen on interfaces the job did not name, and a launcher waiting on
it must give up (or see the keys) by its deadline instead of blocking inside torch.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import psutil
import pytest

from shoal.cluster.store import StoreUnreachable, connect, serve, wait_for


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def server():
    return serve("127.0.0.1")


def listening(port: int) -> list[str]:
    """The addresses this process listens on at `port`."""
    return [entry.laddr.ip for entry in psutil.Process().net_connections(kind="tcp")
            if entry.status == psutil.CONN_LISTEN and entry.laddr.port == port]


def test_a_store_served_on_loopback_listens_only_there(server):
    assert listening(server.port) == ["127.0.0.1"]


def test_a_client_sees_the_keys_set_on_the_server(server):
    server.set("run_id", "job-7")
    client = connect("127.0.0.1", server.port, time.monotonic() + 5, "the job's store")
    assert client.get("run_id") == b"job-7"


def test_a_store_nobody_serves_is_unreachable_by_the_deadline():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(StoreUnreachable, match=rf"could not reach the job's store at 127\.0\.0\.1:{port}: "):
        connect("127.0.0.1", port, started + 1, "the job's store")
    assert time.monotonic() - started < 5


def test_waiting_for_missing_keys_returns_them_after_the_deadline(server):
    server.set("present", "1")
    started = time.monotonic()
    assert wait_for(server, ["present", "absent"], started + 0.5) == ["absent"]
    assert 0.5 <= time.monotonic() - started < 3


def test_waiting_for_keys_that_exist_returns_nothing(server):
    server.set("present", "1")
    assert wait_for(server, ["present"], time.monotonic() + 5) == []


def test_only_the_store_module_builds_clients_and_only_the_keys_module_spells_keys():
    """One place builds the job's store clients (the network probe's store is its own) and one names its keys."""
    source = Path(__file__).resolve().parents[3] / "src" / "shoal"
    builders, spellers = set(), set()
    for path in source.rglob("*.py"):
        text, name = path.read_text(), path.relative_to(source).as_posix()
        if "TCPStore(" in text:
            builders.add(name)
        if re.search(r"""f?["'](shoal/|attempt/|node/|left/)""", text):
            spellers.add(name)
    assert builders == {"cluster/store.py", "plan/network_probe.py"}
    assert spellers == {"cluster/keys.py"}
