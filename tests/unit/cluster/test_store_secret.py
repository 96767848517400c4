"""A job's keys in a store anyone may reach: named and sealed by the job's secret, so that a stranger can neither
find the keys the job acts on, nor learn the secret from the store's keys and values, nor have a value of its own,
moved or replayed believed (the head handing its nodes the
secret, through real node processes: tests/processes/cluster/test_store_secret.py)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from shoal.cluster.env import DistInfo
from shoal.cluster.heartbeat import SILENT_KEY, liveness_store, verdict
from shoal.cluster.node.rendezvous import INSECURE_SECRET, Nodes, job_secret
from shoal.cluster.store import SECRET_VARIABLE, Forged, Sealed, group_store, serve
from shoal.errors import ConfigError

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


# ---------------------------------------------------------------- every value sealed


def stranger_of(server) -> dist.TCPStore:
    """A client of the store that holds no secret: it lists, reads and writes anything."""
    return dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False)


def test_a_value_read_from_the_store_shows_no_secret_and_a_stranger_s_value_is_not_believed(capsys):
    server = serve("127.0.0.1")
    job = Sealed(server, SECRET, "instance-1")
    job.set("end", "stopped by its own")
    stranger = stranger_of(server)
    [name] = stranger.list_keys()
    assert SECRET.encode() not in stranger.get(name) and stranger.get(name).endswith(b"stopped by its own")
    stranger.set(name, "maintenance: stopped by the operator")
    assert not job.check(["end"])
    with pytest.raises(Forged, match=r"forged value for 'end'"):
        job.get("end")
    assert "the job's secret did not make: ignored" in capsys.readouterr().err


def test_a_value_moved_to_another_key_or_replayed_from_another_instance_is_refused():
    server = serve("127.0.0.1")
    job, earlier = Sealed(server, SECRET, "instance-2"), Sealed(server, SECRET, "instance-1")
    job.set("node/1/host", "stopped")
    stranger = stranger_of(server)
    stranger.set(job.name("end"), stranger.get(job.name("node/1/host")))  # moved
    assert not job.check(["end"])
    stranger.set(job.name("end"), earlier.seal.seal("end", "an old job's end"))  # replayed from another job
    assert not job.check(["end"]) and earlier.check(["end"])
    stranger.set(job.name("end"), Sealed(server, "another secret").seal.seal("end", "forged"))
    assert not job.check(["end"])


def test_the_job_s_own_value_replaces_a_forged_one_and_is_kept_once_set():
    server = serve("127.0.0.1")
    job = Sealed(server, SECRET, "instance")
    stranger_of(server).set(job.name("end"), "forged")
    assert job.compare_set("end", "", "stopped by its own") == b"stopped by its own"
    assert job.compare_set("end", "", "a second end") == b"stopped by its own"
    assert job.get("end") == b"stopped by its own"


def test_the_process_group_s_values_are_sealed_too():
    server = serve("127.0.0.1")
    group = group_store(server, SECRET, "instance/attempt/0")
    group.set("rank/0", "10.0.0.1:5000")
    assert group.get("rank/0") == b"10.0.0.1:5000"
    stranger = stranger_of(server)
    [name] = stranger.list_keys()
    stranger.set(name, "10.6.6.6:5000")  # a stranger's address for gloo to connect to
    with pytest.raises(Forged, match="rank/0"):
        group.get("rank/0")
    with pytest.raises(Forged):
        group_store(server, SECRET, "instance/attempt/1").get("rank/0")


def test_machines_started_by_hand_need_a_secret_unless_insecure(capsys):
    with pytest.raises(ConfigError, match=r"^--rdzv-endpoint head:29400: a job of several machines needs a secret .* "
                                          r"--secret-file FILE .*--insecure"):
        job_secret(Nodes(count=2, endpoint="head:29400"))
    assert job_secret(Nodes(count=2, endpoint="head:29400", insecure=True)) == INSECURE_SECRET
    assert "--insecure" in capsys.readouterr().err
    assert job_secret(Nodes(count=2, endpoint="head:29400", secret=SECRET)) == SECRET
    assert len({job_secret(Nodes()) for _ in range(2)}) == 2  # one machine: a fresh secret each time


def test_the_process_group_s_compare_and_set_works_on_sealed_values():
    group = group_store(serve("127.0.0.1"), SECRET, "instance/attempt/0")
    assert group.compare_set("leader", "", "rank 0") == b"rank 0"  # absent: set
    assert group.compare_set("leader", "", "rank 1") == b"rank 0"  # held: kept
    assert group.compare_set("leader", "rank 0", "rank 2") == b"rank 2"  # the value expected: replaced
    assert group.get("leader") == b"rank 2"
