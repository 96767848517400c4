"""Datasets served over Arrow Flight: a remote share is exactly the local one, costs only its own bytes,
and only the job's processes may read it; refusals and failures are one line naming the path and the server
(what a stranger, a replayed call or an altered row meets: tests/unit/data/test_flight_trust.py)."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
import torch

from shoal.data import retry
from shoal.data.flight import DataServer, RemoteDataset, open_remote
from shoal.data.format import Dataset, DatasetWriter, open_dataset
from shoal.data.loader import ShardLoader, plan_memory
from shoal.data.signing import signed_request, stream_key
from shoal.errors import DataError, StoreError

SECRET = "the job's secret"
ROWS, WIDTH = 600, 12
ROW_BYTES = WIDTH * 4
RANGES = [(0, ROWS), (0, 1), (230, 270), (35, 45), (240, 520), (599, 600), (300, 300)]
"""The whole set, one row, across files (250 rows each), across row groups (40 rows each), the last row, none."""


def write(path: Path, features: np.ndarray, labels: np.ndarray) -> str:
    with DatasetWriter(str(path), (features.shape[1],), np.float32, rows_per_file=250, row_group_size=40) as writer:
        writer.write(features, labels)
    return str(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A labelled set and one with a NaN, served under the job's names for them (paths this machine lacks)."""
    folder = tmp_path_factory.mktemp("flight")
    generator = np.random.default_rng(4)
    features = generator.standard_normal((ROWS, WIDTH), dtype=np.float32)
    labels = np.array(["cat", "dog", "eel"])[generator.integers(0, 3, ROWS)]
    local = write(folder / "train", features, labels)
    broken = features[:60].copy()
    broken[23, 5] = np.nan
    nan_local = write(folder / "broken", broken, labels[:60])
    names = {"train": str(folder / "job" / "train"), "broken": str(folder / "job" / "broken")}
    with DataServer({names["train"]: local, names["broken"]: nan_local}, SECRET, "127.0.0.1") as server:
        yield server, names, open_dataset(local), open_dataset(nan_local)


def remote(server: DataServer, name: str, secret: str = SECRET) -> RemoteDataset:
    return open_remote(f"127.0.0.1:{server.port}", name, secret)


def signed(method: str, secret: str = SECRET, **fields) -> bytes:
    """A call as the job's processes sign it."""
    return signed_request(stream_key(secret), method, fields)[0]


@pytest.mark.parametrize("start,stop", RANGES)
def test_a_share_read_remotely_is_exactly_the_local_read(served, start, stop):
    server, names, local, _ = served
    dataset = remote(server, names["train"])
    assert isinstance(dataset, Dataset) and dataset.path == names["train"]
    features, labels = dataset.read_rows(start, stop)
    expected_features, expected_labels = local.read_rows(start, stop)
    assert features.dtype == expected_features.dtype and features.shape == expected_features.shape
    np.testing.assert_array_equal(features, expected_features)
    np.testing.assert_array_equal(labels, expected_labels)
    pieces = list(dataset.iter_rows(start, stop, max_rows=7, finite=True))
    assert all(len(block) <= 7 for _, block, _ in pieces)
    assert [position for position, _, _ in pieces] == list(np.cumsum([0] + [len(b) for _, b, _ in pieces])[:-1])
    raw = list(local.iter_rows(start, stop))
    np.testing.assert_array_equal(np.concatenate([b for _, b, _ in pieces] or [np.empty((0, WIDTH), np.float32)]),
                                  np.concatenate([b for _, b, _ in raw] or [np.empty((0, WIDTH), np.float32)]))
    assert [str(v) for _, _, label in pieces for v in label] == [str(v) for _, _, label in raw for v in label]
    dataset.close()


def test_meta_fingerprint_and_digest_are_the_local_ones(served):
    server, names, local, _ = served
    dataset = remote(server, names["train"])
    assert dataset.meta == local.meta
    assert (dataset.rows, dataset.shape, dataset.classes, dataset.num_classes, dataset.labeled) == \
        (local.rows, local.shape, local.classes, local.num_classes, local.labeled)
    assert dataset.description_digest().hexdigest() == local.description_digest().hexdigest()
    assert dataset.fingerprint() == local.fingerprint()
    assert dataset.schema_key() == local.schema_key()
    dataset.close()


def test_a_share_costs_its_own_bytes_not_the_whole_sets(served):
    server, names, _, _ = served
    dataset = remote(server, names["train"])
    sent_before = server.bytes_by_path[os_path(names["train"])]
    dataset.bytes_received = 0
    served_set = server.datasets[os_path(names["train"])]
    served_set.opened.clear()
    dataset.read_rows(100, 200)
    assert served_set.opened == [("part-00000.parquet", group) for group in (2, 3, 4)]  # 40 rows a group
    sent = 120  # whole blocks are sent, so that each is checked against its digest: here a block is a row group
    labels = sent * (4 + 3) + 4  # the label strings: an offset and three letters a row
    assert sent * ROW_BYTES <= dataset.bytes_received <= sent * ROW_BYTES + labels + 256
    assert dataset.bytes_received < ROWS * ROW_BYTES / 4  # the blocks that hold the share, not the set
    assert server.bytes_by_path[os_path(names["train"])] - sent_before == dataset.bytes_received
    assert server.bytes_sent == sum(server.bytes_by_path.values())
    dataset.close()


def os_path(name: str) -> str:
    return str(Path(name))


def test_a_wrong_secret_and_an_unsigned_call_are_refused(served):
    server, names, _, _ = served
    address = f"127.0.0.1:{server.port}"
    with pytest.raises(DataError) as caught:
        remote(server, names["train"], secret="another job's secret")
    assert str(caught.value) == (f"{names['train']}: the data server at {address} refused the call: the call is not "
                                 "signed with this job's secret (another job's server, or a process without the job's "
                                 "secret?)")
    client = flight.connect(f"grpc+tcp://{address}")
    with pytest.raises(flight.FlightUnauthenticatedError):
        list(client.do_action(flight.Action("meta", names["train"].encode())))
    ticket = flight.Ticket(json.dumps({"path": names["train"], "start": 0, "stop": 40}).encode())
    with pytest.raises(flight.FlightUnauthenticatedError):
        client.do_get(ticket).read_all()
    guessed = signed("rows", "guess", path=names["train"], start=0, stop=40, max_rows=None)
    with pytest.raises(flight.FlightUnauthenticatedError, match="not signed with this job's secret"):
        client.do_get(flight.Ticket(guessed)).read_all()
    client.close()


def test_a_path_not_served_is_refused_naming_it_and_the_server(served):
    server, names, _, _ = served
    local_folder = str(Path(names["train"]).parent.parent / "train")  # served, but under the job's name only
    for name in ("/elsewhere/train", local_folder):
        with pytest.raises(DataError, match=rf"^{name}: the data server at 127\.0\.0\.1:{server.port}: "
                                            "not a dataset this server serves$"):
            remote(server, name)


def test_writes_and_everything_but_reads_are_refused(served):
    server, names, _, _ = served
    client = flight.connect(f"grpc+tcp://127.0.0.1:{server.port}")
    descriptor = flight.FlightDescriptor.for_path(names["train"])
    with pytest.raises(flight.FlightUnauthorizedError, match="read-only"):
        writer, _ = client.do_put(descriptor, pa.schema([("label", pa.int64())]))
        writer.write_table(pa.table({"label": [1]}))
        writer.close()
    with pytest.raises(flight.FlightUnauthorizedError, match="not offered"):
        list(client.do_action(flight.Action("drop", signed("drop", path=names["train"]))))
    with pytest.raises(flight.FlightUnauthorizedError):
        list(client.list_flights())
    with pytest.raises(flight.FlightUnauthorizedError):
        client.list_actions()
    for rows in ({"start": 560, "stop": 601}, {"start": -1, "stop": 40}, {"start": 40, "stop": 0}, {},
                 {"start": 35, "stop": 45}):
        ticket = flight.Ticket(signed("rows", path=names["train"], max_rows=None, **rows))
        with pytest.raises(flight.FlightServerError, match="rows"):
            client.do_get(ticket).read_all()
    with pytest.raises(flight.FlightUnauthenticatedError):
        client.do_get(flight.Ticket(b"not json")).read_all()
    client.close()


def test_a_nan_row_is_refused_naming_the_users_path_as_a_local_read_does(served):
    server, names, _, broken = served
    with pytest.raises(DataError) as local_error:
        broken.read_rows(0, 60)
    with pytest.raises(DataError) as remote_error:
        remote(server, names["broken"]).read_rows(0, 60)
    assert str(remote_error.value) == str(local_error.value).replace(broken.path, names["broken"])
    assert str(remote_error.value).startswith(f"{names['broken']}/part-00000.parquet: row 24 of the dataset")


def test_a_shard_loader_gives_the_same_batches_remote_as_local_in_memory_and_in_cache(served):
    server, names, local, _ = served
    share = ROWS // 3
    budget = share * 8 + 2 * 60 * ROW_BYTES  # sub-partitions of 60 rows: the share does not fit
    assert plan_memory(share, ROW_BYTES, 16, budget) == 60
    for memory_budget in (None, budget):
        options = dict(rank=1, world_size=3, batch_size=16, seed=7, memory_budget=memory_budget)
        here, there = ShardLoader(local, **options), ShardLoader(remote(server, names["train"]), **options)
        held = ("mode", "rows", "sub_partitions", "rows_per_sub_partition")
        assert [here.describe().get(key) for key in held] == [there.describe().get(key) for key in held]
        assert (there.cache is None) == (memory_budget is None)
        for epoch in (0, 1):
            for (x1, y1), (x2, y2) in zip(here.batches(epoch), there.batches(epoch), strict=True):
                assert torch.equal(x1, x2) and torch.equal(y1, y2)
        here.close()
        there.close()
        there.dataset.close()
        assert there.dataset.bytes_received < ROWS * ROW_BYTES / 2  # its share, not the set


def test_the_server_closes_cleanly_and_a_closed_one_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(retry, "FIRST_PAUSE", 0.0)
    local = write(tmp_path / "set", np.zeros((10, WIDTH), np.float32), np.arange(10) % 2)
    threads = set(threading.enumerate())
    with DataServer({"/job/set": local}, SECRET, "127.0.0.1") as server:
        dataset = remote(server, "/job/set")
        assert dataset.read_rows(2, 9)[0].shape == (7, WIDTH)
        pieces = dataset.iter_rows(0, 10, max_rows=2)
        next(pieces)
        pieces.close()  # a reader that stops early: the server must not wait for it
    assert server.close() is True
    assert set(threading.enumerate()) == threads
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", server.port)) != 0
    with pytest.raises(StoreError, match=rf"^/job/set: the data server at 127\.0\.0\.1:{server.port} could not "
                                         r"be reached in 3 tries \(.*\); this may be transient: run again$") as caught:
        dataset.read_rows(0, 10)
    assert "\n" not in str(caught.value) and "debug context" not in str(caught.value)
    with pytest.raises(StoreError, match=rf"^/job/set: the data server at 127\.0\.0\.1:{server.port} "):
        remote(server, "/job/set")
    dataset.close()


def test_a_bad_address_and_a_missing_dataset_are_one_line(tmp_path):
    with pytest.raises(DataError, match=r"^/job/set: the data server's address 'nowhere' is not host:port$"):
        open_remote("nowhere", "/job/set", SECRET)
    with pytest.raises(DataError, match="dataset not found"):
        DataServer({"/job/set": str(tmp_path / "absent")}, SECRET, "127.0.0.1")


def test_a_stream_in_flight_ends_when_the_server_closes(tmp_path, monkeypatch):
    monkeypatch.setattr(retry, "FIRST_PAUSE", 0.0)
    rows = 20_000
    with DatasetWriter(str(tmp_path / "set"), (WIDTH,), np.float32) as writer:
        writer.write(np.zeros((rows, WIDTH), np.float32), np.arange(rows) % 2)
    server = DataServer({"/job/set": str(tmp_path / "set")}, SECRET, "127.0.0.1")
    dataset = remote(server, "/job/set")
    pieces = dataset.iter_rows(0, rows, max_rows=1)  # one row a message: far slower to send than to close
    next(pieces)
    closed: list[bool] = []
    closing = threading.Thread(target=lambda: closed.append(server.close()))
    closing.start()
    received = 1
    with pytest.raises(StoreError, match=r"^/job/set: the data server at .* could not be reached in 3 tries"):
        for _ in pieces:
            received += 1
    closing.join(10)
    assert closed == [True] and received < rows
    dataset.close()
