"""Who the job's data stream believes, against real Arrow Flight servers on threads of this process: only calls
signed with the job's secret, fresh and new, are answered; only answers signed with it are believed; only rows
that match the digests the server took of its files are given. A stranger at the data port, one relaying the
real server's answers with labels flipped, a server that alters a label and a file changed on disk are each one
line naming the dataset, and none gives a wrong row."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from shoal.data.flight import DataServer, open_remote
from shoal.data.format import DatasetWriter, open_dataset
from shoal.data.row_digests import BLOCK_BYTES, BlockDigests
from shoal.data.signing import WINDOW_SECONDS, answer_mac, signed_request, stream_key
from shoal.errors import DataError

SECRET = "the job's secret"
NAME = "/job/data/train"
ROWS, WIDTH, GROUP = 200, 6, 40
UNPROVEN = "did not prove it holds the job's secret"


def write(path: Path, labels: np.ndarray, width: int = WIDTH) -> str:
    features = np.arange(len(labels) * width, dtype=np.float32).reshape(len(labels), width)
    with DatasetWriter(str(path), (width,), np.float32, rows_per_file=100, row_group_size=GROUP) as writer:
        writer.write(features, labels)
    return str(path)


def labels_of(rows: int) -> np.ndarray:
    return np.array(["cat", "dog"])[np.arange(rows) % 2]


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[DataServer, str]]:
    local = write(tmp_path / "train", labels_of(ROWS))
    with DataServer({NAME: local}, SECRET, "127.0.0.1") as server:
        yield server, local


def address(server: flight.FlightServerBase) -> str:
    return f"127.0.0.1:{server.port}"


def pieces_until_error(dataset, start: int, stop: int, max_rows: int | None = None) -> tuple[list, DataError]:
    """The pieces a read gives before it fails, and its error."""
    given = []
    with pytest.raises(DataError) as caught:
        for piece in dataset.iter_rows(start, stop, max_rows=max_rows):
            given.append(piece)
    return given, caught.value


def assert_local(given: list, local: str, start: int) -> None:
    """Every piece given is exactly the stored rows."""
    stored = open_dataset(local)
    for position, block, label in given:
        pieces = list(stored.iter_rows(start + position, start + position + len(block)))
        np.testing.assert_array_equal(block, np.concatenate([features for _, features, _ in pieces]))
        np.testing.assert_array_equal(label, np.concatenate([labels for _, _, labels in pieces]))


@pytest.mark.parametrize("labels", [np.arange(ROWS) % 3, np.linspace(-1, 1, ROWS), labels_of(ROWS),
                                    np.arange(ROWS) % 2 == 0], ids=["ints", "floats", "text", "booleans"])
def test_the_right_secret_reads_exactly_the_stored_rows_whatever_the_labels(tmp_path, labels):
    local = write(tmp_path / "set", labels)
    with DataServer({NAME: local}, SECRET, "127.0.0.1") as server:
        remote = open_remote(address(server), NAME, SECRET)
        for start, stop in ((0, ROWS), (37, 163), (99, 101), (199, 200)):
            pieces = list(remote.iter_rows(start, stop, max_rows=7))
            assert all(len(block) <= 7 for _, block, _ in pieces)
            assert sum(len(block) for _, block, _ in pieces) == stop - start
            assert_local(pieces, local, start)
        remote.close()


def test_a_row_wider_than_a_block_is_a_block_of_its_own(tmp_path):
    width = BLOCK_BYTES // 4 + 3
    local = write(tmp_path / "wide", labels_of(5), width=width)
    with DataServer({NAME: local}, SECRET, "127.0.0.1") as server:
        remote = open_remote(address(server), NAME, SECRET)
        np.testing.assert_array_equal(remote.read_rows(1, 4)[0], open_dataset(local).read_rows(1, 4)[0])
        assert remote.bytes_received < 4 * width * 4  # rows 1 to 3 only: each row is a block
        remote.close()


def signed_rows(secret: str = SECRET, now: float | None = None, **rows) -> flight.Ticket:
    fields = {"path": NAME, "start": 0, "stop": GROUP, "max_rows": None, **rows}
    return flight.Ticket(signed_request(stream_key(secret), "rows", fields, now)[0])


def test_a_recorded_call_played_again_is_refused(served):
    server, _ = served
    client = flight.connect(f"grpc+tcp://{address(server)}")
    recorded = signed_rows()
    assert client.do_get(recorded).read_all().num_rows == GROUP
    with pytest.raises(flight.FlightUnauthenticatedError, match="answered once already"):
        client.do_get(recorded).read_all()
    meta = flight.Action("meta", signed_request(stream_key(SECRET), "meta", {"path": NAME})[0])
    assert len(list(client.do_action(meta))) == 2
    with pytest.raises(flight.FlightUnauthenticatedError, match="answered once already"):
        list(client.do_action(meta))
    client.close()


def test_a_stale_call_an_altered_one_and_one_for_another_method_are_refused(served):
    server, _ = served
    client = flight.connect(f"grpc+tcp://{address(server)}")
    for offset in (-2 * WINDOW_SECONDS, 2 * WINDOW_SECONDS):
        with pytest.raises(flight.FlightUnauthenticatedError, match=r"signed [-+]120 s from the data server's clock, "
                                                                   r"beyond the 60 s a call is good for"):
            client.do_get(signed_rows(now=time.time() + offset)).read_all()
    mac, _, body = signed_rows().ticket.partition(b" ")
    wider = json.dumps({**json.loads(body), "stop": ROWS}, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(flight.FlightUnauthenticatedError, match="not signed with this job's secret"):
        client.do_get(flight.Ticket(mac + b" " + wider)).read_all()
    as_meta = flight.Action("meta", signed_rows().ticket)
    with pytest.raises(flight.FlightUnauthenticatedError, match="signed for 'rows', not 'meta'"):
        list(client.do_action(as_meta))
    client.close()


def test_a_wrong_secret_is_refused_in_one_line(served):
    server, _ = served
    with pytest.raises(DataError) as caught:
        open_remote(address(server), NAME, "another job's secret")
    assert str(caught.value).startswith(f"{NAME}: the data server at {address(server)} refused the call: the call is "
                                        "not signed with this job's secret")
    assert "\n" not in str(caught.value)


class Stranger(flight.FlightServerBase):
    """A process at the data port without the job's secret: it answers with the stored meta.json (from a copy of
    the data, say), signed with the only key it can make."""

    def __init__(self, local: str):
        super().__init__("grpc+tcp://127.0.0.1:0")
        self.meta = open_dataset(local).meta
        self.key = stream_key("a guess")

    def do_action(self, context, action):
        answer = json.dumps(self.meta).encode()
        return [answer, answer_mac(self.key, b"", answer)]


def test_a_stranger_at_the_data_port_is_one_line_and_gives_no_row(served):
    _, local = served
    with Stranger(local) as stranger:
        with pytest.raises(DataError) as caught:
            open_remote(address(stranger), NAME, SECRET)
    assert str(caught.value) == (f"{NAME}: the data server at {address(stranger)} {UNPROVEN} (its answer is not "
                                 "signed with it): another process answers at that port, so nothing it sent was used")


def flipped(batch: pa.RecordBatch, row: int) -> pa.RecordBatch:
    """The batch with the label of its row `row` flipped (cat and dog)."""
    labels = batch.column("label").to_pylist()
    labels[row] = {"cat": "dog", "dog": "cat"}[labels[row]]
    return pa.record_batch([batch.column("features"), pa.array(labels, batch.schema.field("label").type)],
                           schema=batch.schema)


class Relay(flight.FlightServerBase):
    """A stranger in the middle, without the job's secret: it passes each call to the job's server (a signed call
    goes through once) and its answers back, with one label of the rows flipped; with `resign`, it also puts
    the digests of the rows it sends in place of the server's."""

    def __init__(self, upstream: str, flip_at: int, resign: bool = False):
        super().__init__("grpc+tcp://127.0.0.1:0")
        self.upstream = flight.connect(f"grpc+tcp://{upstream}")
        self.flip_at, self.resign = flip_at, resign

    def do_action(self, context, action):
        return [result.body.to_pybytes() for result in self.upstream.do_action(action)]

    def do_get(self, context, ticket):
        reader = self.upstream.do_get(ticket)
        return flight.GeneratorStream(reader.schema, self._altered(reader, json.loads(ticket.ticket.split(b" ")[1])))

    def _altered(self, reader, request: dict):
        row = request["start"]
        for chunk in reader:
            batch, metadata = chunk.data, chunk.app_metadata.to_pybytes()
            if row <= self.flip_at < row + batch.num_rows:
                batch = flipped(batch, self.flip_at - row)
                if self.resign:
                    metadata = metadata[:32] + digest_of(batch) + metadata[64:]
            yield batch, pa.py_buffer(metadata)
            row += batch.num_rows

    def shutdown(self):
        self.upstream.close()
        super().shutdown()


def digest_of(batch: pa.RecordBatch) -> bytes:
    """The digest of a batch that holds exactly one block (a row group of `GROUP` rows)."""
    blocks = BlockDigests(np.array([0, batch.num_rows]), 0)
    features = np.frombuffer(b"".join(batch.column("features").to_pylist()), np.float32).reshape(-1, WIDTH)
    return blocks.add(features, batch.column("label"))[0][2]


@pytest.mark.parametrize("resign", [False, True], ids=["digests-kept", "digests-replaced"])
def test_a_stranger_relaying_the_server_with_a_label_flipped_gives_no_wrong_row(served, resign):
    server, local = served
    with Relay(address(server), flip_at=50, resign=resign) as relay:
        remote = open_remote(address(relay), NAME, SECRET)  # meta.json passes through untouched: it is the server's
        given, error = pieces_until_error(remote, 0, 100)
        remote.close()
    assert_local(given, local, 0)
    assert sum(len(block) for _, block, _ in given) <= GROUP  # the block with the flipped label: none of it
    if resign:
        assert str(error).startswith(f"{NAME}: the data server at {address(relay)} {UNPROVEN}")
    else:
        assert str(error) == (f"{NAME}/part-00000.parquet: rows 41 to 80 of the dataset, as the data server at "
                              f"{address(relay)} sent them, differ from the digests it took of its files when it "
                              "started (altered on the way, or misread there): none of them was used")
    assert "\n" not in str(error)


class Altering(DataServer):
    """The job's server (it holds the secret) with one label altered on the way out."""

    def _served_batches(self, dataset, start, stop, rows):
        row = start
        for batch in super()._served_batches(dataset, start, stop, rows):
            yield flipped(batch, 150 - row) if row <= 150 < row + batch.num_rows else batch
            row += batch.num_rows


def test_a_label_altered_by_the_server_on_the_way_out_is_caught_by_the_digests(tmp_path):
    local = write(tmp_path / "train", labels_of(ROWS))
    with Altering({NAME: local}, SECRET, "127.0.0.1") as server:
        remote = open_remote(address(server), NAME, SECRET)
        assert_local(list(remote.iter_rows(0, 100)), local, 0)  # the first file's rows are the stored ones
        given, error = pieces_until_error(remote, 100, 200, max_rows=16)
        remote.close()
    assert_local(given, local, 100)
    assert sum(len(block) for _, block, _ in given) == 40  # rows 101 to 140; none of the altered block
    assert str(error).startswith(f"{NAME}/part-00001.parquet: rows 141 to 180 of the dataset, as the data server at "
                                 f"{address(server)} sent them, differ from the digests")


def test_a_file_changed_on_the_servers_disk_after_it_started_is_caught(tmp_path, served):
    server, local = served
    remote = open_remote(address(server), NAME, SECRET)
    assert_local(list(remote.iter_rows(0, 10)), local, 0)  # the server has taken its digests
    changed = labels_of(ROWS)
    changed[150] = "dog"  # a cat
    rewritten = write(tmp_path / "rewritten", changed)
    Path(local, "part-00001.parquet").write_bytes(Path(rewritten, "part-00001.parquet").read_bytes())
    assert open_dataset(local).read_rows(150, 151)[1].tolist() == [1]  # read here, the row is the dog now
    given, error = pieces_until_error(remote, 100, 200)
    remote.close()
    assert_local(given, rewritten, 100)
    assert sum(len(block) for _, block, _ in given) == 40  # rows 101 to 140, which did not change
    assert str(error).startswith(f"{NAME}/part-00001.parquet: rows 141 to 180 of the dataset")
