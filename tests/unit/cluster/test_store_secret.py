"""A job's keys in a store anyone may reach: named by the job's secret, so that a stranger can neither find
the keys the job acts on nor learn the secret from the store's list of keys."""

from __future__ import annotations

import sys

import torch.distributed as dist

from shoal.cluster.env import DistInfo
from shoal.cluster.heartbeat import SILENT_KEY, liveness_store, verdict
from shoal.cluster.remote import Fleet, Host, remote_command
from shoal.cluster.store import SECRET_VARIABLE, Sealed, group_store, serve

SECRET = "0123456789abcdef0123456789abcdef"


def test_sealed_keys_are_found_only_with_the_secret():
    server = serve("127.0.0.1")
    Sealed(server, SECRET).set("end", "stopped")
    assert not server.check(["end"]) and not Sealed(server, "another").check(["end"])
    assert Sealed(server, SECRET).get("end") == b"stopped"
    assert all(SECRET not in key and "end" not in key for key in server.list_keys())


def test_the_process_groups_keys_do_not_show_the_secret():
    server = serve("127.0.0.1")
    group_store(server, SECRET).set("rank/0", "address")
    assert [SECRET in key for key in server.list_keys()] == [False]


def test_a_worker_beats_under_the_secret_its_launcher_handed_it(monkeypatch):
    server = serve("127.0.0.1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv(SECRET_VARIABLE, SECRET)
    store = liveness_store(DistInfo(rank=0, world_size=2))
    store.set(SILENT_KEY, '{"rank": 1}')
    assert verdict(server) is None  # a stranger's view: no verdict to act on
    assert verdict(Sealed(server, SECRET)) == {"rank": 1}  # the launcher's view
    assert isinstance(server, dist.TCPStore)


def test_a_hosts_head_hands_its_nodes_the_secret_on_their_input(capsys):
    node = [sys.executable, "-c", "import os; from shoal.cluster.remote import stop_when_input_closes as node; "
                                  "print('secret', node(), flush=True); os._exit(0)"]  # as shoal ends
    fleet = Fleet([Host("localhost")], [node], "env SHOAL_TEST_HOST={host} sh -c", secret=SECRET)
    assert fleet.run() == 0
    assert f"[localhost] secret {SECRET}" in capsys.readouterr().out.splitlines()
    assert not any(SECRET in word for word in remote_command(fleet.template, "localhost", node))
