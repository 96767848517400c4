"""A job's keys in a store anyone may reach: named by the job's secret, so that a stranger can neither find
the keys the job acts on nor learn the secret from the store's list of keys (the head handing its nodes the
secret, through real node processes: tests/processes/cluster/test_store_secret.py)."""

from __future__ import annotations

import torch.distributed as dist

from shoal.cluster.env import DistInfo
from shoal.cluster.heartbeat import SILENT_KEY, liveness_store, verdict
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
