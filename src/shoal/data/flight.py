"""Datasets served over Arrow Flight, for machines that have no copy of them.

A job's first machine holds its datasets; the others may share no folder with it. `DataServer`
serves the job's dataset folders from that machine, read-only, and `open_remote` opens one of
them elsewhere as a `Dataset` whose meta comes from the server and whose rows are streamed on
demand: a worker fetches only the rows of its share, as Arrow record batches holding exactly the
stored `features` and `label` values.

What is protected, and how (`shoal.data.signing`, `shoal.data.row_digests`):
- Only the job's processes are answered: every call is signed afresh with a key taken from the
  job's secret (HMAC-SHA256 over its method, its exact parameters, a random nonce and the time),
  and the server checks it, in constant time, before it reads anything. A call signed more than
  60 s (`shoal.data.signing.WINDOW_SECONDS`) from the server's clock, or one already answered, is
  refused, so a recorded call cannot be played again (the machines' clocks must agree that well).
- Only the job's server is believed: every answer carries an HMAC of the same key over the call it
  answers and what it holds (meta.json, the fingerprint, each message of rows with the digests of
  the blocks that begin in it). An answer without the right MAC, from anyone listening at the port
  the job's store gave, is a one-line `DataError` naming the dataset and the address, before a row
  is used.
- Only the stored rows are used: when it starts serving, the server takes a digest of every block
  of its datasets' rows as its files hold them (on a thread of its own; a read waits for its
  dataset's). A reader asks for whole blocks, recomputes each block's digest from what arrived and
  gives no row of a block that does not match: rows altered on the way, or misread on the server
  since it started, are a one-line `DataError` naming the dataset, its file and the rows.
The rows cross the network unencrypted, like gloo's traffic: whoever sees the network sees them.

The server answers on gRPC's own threads from the moment it is built; it never calls Flight's
`serve()`, which would take over SIGINT and SIGTERM for the whole process (the launcher's own
handling of Ctrl-C must stay). Connection failures and refusals reach the user as one-line
`DataError`s naming the dataset and the server's address; a dropped connection is tried again
from the first row not yet received, as a store read is (`shoal.data.retry`).
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq

from shoal.data.format import META_FILE, Dataset, FileInfo, open_dataset
from shoal.data.meta import check_meta
from shoal.data.retry import TRIES, pause
from shoal.data.row_digests import (
    DIGEST_BYTES,
    CheckedRows,
    RowsDiffer,
    block_bounds,
    block_rows,
    dataset_digests,
    starting,
    widened,
)
from shoal.data.signing import Refused, RequestCheck, answer_mac, answered_with_key, signed_request, stream_key
from shoal.errors import DataError, ShoalError, StoreError, first_line

SENT_BATCH_BYTES = 4 * 2**20  # the largest record batch sent: bounds both sides' memory per message
META_ACTION = "meta"
FINGERPRINT_ACTION = "fingerprint"
ROWS_METHOD = "rows"  # do_get's
COLUMNS = ["features", "label"]
CALL_SECONDS = 60.0  # for the short calls (meta, fingerprint); a stream of rows takes as long as it needs
CLOSE_SECONDS = 10.0
RETRIED = (flight.FlightUnavailableError, flight.FlightTimedOutError)  # the server or the network, for a moment
MAC_BYTES = 32
WAIT_SECONDS = 0.5  # how often a read waiting for its dataset's digests looks whether the server is closing


def normal_path(path: str) -> str:
    """A dataset's name as both sides compare it: a local path without a trailing or doubled slash."""
    path = str(path)
    return path if "://" in path else os.path.normpath(path)


@dataclass
class _Digests:
    """A served dataset's block digests, once its files have been read through (or why they could not be)."""

    ready: threading.Event = field(default_factory=threading.Event)
    value: bytes = b""
    error: str | None = None


class DataServer(flight.FlightServerBase):
    """The job's datasets, served read-only to the job's processes on other machines.

    `datasets` maps each dataset's name as the job gives it (the user's path) to its folder here.
    Built, it answers at once on `host`:`port` (`port` 0: a free one, then in `.port`) until
    `close()`, and takes its datasets' block digests on a thread of its own. Only `do_get` of a row
    range (whole blocks) and the `meta` and `fingerprint` actions are answered, each only to a call
    signed with the job's secret (`shoal.data.signing`), each answer signed back.
    """

    def __init__(self, datasets: dict[str, str], secret: str, host: str, port: int = 0):
        if not secret:
            raise ValueError("the data server needs the job's secret")
        self.datasets: dict[str, Dataset] = {normal_path(name): open_dataset(folder)
                                             for name, folder in datasets.items()}
        self.host = host
        self.bytes_sent = 0
        self.bytes_by_path = dict.fromkeys(self.datasets, 0)
        self._key = stream_key(secret)
        self._check = RequestCheck(self._key)
        self._bounds = {name: block_bounds(dataset) for name, dataset in self.datasets.items()}
        self._digests = {name: _Digests() for name in self.datasets}
        self._count_lock = threading.Lock()
        self._closed = False
        bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host  # an IPv6 address
        super().__init__(f"grpc+tcp://{bracketed}:{port}")
        self._digesting = threading.Thread(target=self._take_digests, name="shoal-data-digests", daemon=True)
        self._digesting.start()

    def _take_digests(self) -> None:
        """Every served dataset's block digests, from its files as they are now: what every reader is checked
        against for as long as the server serves."""
        for name, dataset in self.datasets.items():
            held = self._digests[name]
            try:
                held.value = dataset_digests(self._bounds[name], self._stored_rows(dataset))
            except _Closing:
                held.error = "the data server is closing"
            except (OSError, pa.ArrowException, ValueError, ShoalError) as error:
                held.error = first_line(error)
            finally:
                held.ready.set()

    def _stored_rows(self, dataset: Dataset) -> Iterator[tuple[np.ndarray, pa.Array]]:
        rows = max(1, SENT_BATCH_BYTES // max(1, dataset.features * dataset.feature_dtype.itemsize))
        for batch in _read_batches(dataset, 0, dataset.rows, rows, record=False):
            if self._closed:
                raise _Closing
            yield dataset._feature_block(batch.column("features"), batch.num_rows), batch.column("label")

    def _verified(self, wire: bytes, method: str) -> tuple[dict[str, Any], bytes]:
        """A call's body and identity if it is signed with the job's secret, fresh and new; refused otherwise."""
        try:
            return self._check(wire, method)
        except Refused as refused:
            raise flight.FlightUnauthenticatedError(str(refused)) from None

    def _dataset(self, name: Any) -> tuple[str, Dataset]:
        if not isinstance(name, str) or normal_path(name) not in self.datasets:
            raise flight.FlightServerError("not a dataset this server serves")
        return normal_path(name), self.datasets[normal_path(name)]

    def do_action(self, context, action):
        request, request_id = self._verified(action.body.to_pybytes(), action.type)
        if action.type not in (META_ACTION, FINGERPRINT_ACTION):
            raise flight.FlightUnauthorizedError(f"action {action.type!r}: not offered (the server is read-only)")
        name, dataset = self._dataset(request.get("path"))
        if action.type == META_ACTION:
            answer = json.dumps(dataset.meta).encode()
        else:
            try:
                answer = dataset.fingerprint().encode()
            except ShoalError as error:
                raise flight.FlightServerError(str(error)) from None
        self._count(name, len(answer))
        return [answer, answer_mac(self._key, request_id, answer)]

    def list_actions(self, context):
        raise flight.FlightUnauthorizedError("the job's data server lists nothing")

    def do_get(self, context, ticket):
        request, request_id = self._verified(ticket.ticket, ROWS_METHOD)
        name, dataset = self._dataset(request.get("path"))
        start, stop, max_rows = request.get("start"), request.get("stop"), request.get("max_rows")
        if not all(isinstance(value, int) and not isinstance(value, bool) for value in (start, stop)) \
                or not 0 <= start <= stop <= dataset.rows:
            raise flight.FlightServerError(f"rows [{start}, {stop}) outside 0..{dataset.rows}")
        if widened(self._bounds[name], start, stop) != (start, stop):
            raise flight.FlightServerError(f"rows [{start}, {stop}) are not whole blocks of "
                                           f"{block_rows(dataset)} rows")
        digests = self._digests_of(name)
        rows = max(1, SENT_BATCH_BYTES // (dataset.features * dataset.feature_dtype.itemsize))
        if isinstance(max_rows, int) and not isinstance(max_rows, bool) and max_rows >= 1:
            rows = min(rows, max_rows)
        batches = self._counted(name, self._served_batches(dataset, start, stop, rows))
        try:
            first = next(batches, None)  # a failure to open the files is the call's error, not the stream's
        except (OSError, pa.ArrowException, ValueError) as error:
            raise served_error(error) from None
        if first is None:
            return flight.RecordBatchStream(pa.table({column: [] for column in COLUMNS},
                                                     schema=_file_schema(dataset, dataset.files[0])))
        signed = self._signed(request_id, self._bounds[name], digests, start, _same_schema(first, batches))
        return flight.GeneratorStream(first.schema, signed)

    def _served_batches(self, dataset: Dataset, start: int, stop: int, rows: int) -> Iterator[pa.RecordBatch]:
        """The record batches a call for rows [start, stop) is sent."""
        return _read_batches(dataset, start, stop, rows)

    def _digests_of(self, name: str) -> bytes:
        """A served dataset's block digests, waited for while the server takes them."""
        held = self._digests[name]
        while not held.ready.wait(WAIT_SECONDS):
            if self._closed:
                raise flight.FlightUnavailableError("the data server is closing")
        if held.error is not None:
            raise flight.FlightServerError(f"cannot read: {held.error}")
        return held.value

    def _signed(self, request_id: bytes, bounds: np.ndarray, digests: bytes, start: int,
                batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[pa.RecordBatch, pa.Buffer]]:
        """Each batch with its metadata: the digests of the blocks that begin in it, after a MAC over them, the
        call, the batch's place in the stream and its columns' types."""
        row = start
        for index, batch in enumerate(batches):
            span = starting(bounds, row, row + batch.num_rows)
            given = digests[span.start * DIGEST_BYTES: span.stop * DIGEST_BYTES]
            mac = answer_mac(self._key, request_id, _placed(index, row, batch), given)
            yield batch, pa.py_buffer(mac + given)
            row += batch.num_rows

    def _counted(self, name: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if self._closed:  # a stream in flight ends with the server, not after it
                raise flight.FlightUnavailableError("the data server is closing")
            self._count(name, batch.nbytes)
            yield batch

    def _count(self, name: str, count: int) -> None:
        with self._count_lock:
            self.bytes_sent += count
            self.bytes_by_path[name] += count

    def do_put(self, context, descriptor, reader, writer):
        raise flight.FlightUnauthorizedError("the job's data server is read-only")

    def do_exchange(self, context, descriptor, reader, writer):
        raise flight.FlightUnauthorizedError("the job's data server is read-only")

    def list_flights(self, context, criteria):
        raise flight.FlightUnauthorizedError("the job's data server lists nothing: ask for a dataset by name")

    def get_flight_info(self, context, descriptor):
        raise flight.FlightUnauthorizedError("not offered: use the 'meta' action and do_get")

    def get_schema(self, context, descriptor):
        raise flight.FlightUnauthorizedError("not offered: use the 'meta' action and do_get")

    def close(self, timeout: float = CLOSE_SECONDS) -> bool:
        """Stop answering; wait up to `timeout` seconds for calls in flight (a stalled reader could hold the
        server forever, so the shutdown runs on a thread of its own). Whether it finished."""
        if self._closed:
            return True
        self._closed = True
        stopping = threading.Thread(target=self._stop, name="shoal-data-server-shutdown", daemon=True)
        stopping.start()
        stopping.join(timeout)
        return not stopping.is_alive()

    def _stop(self) -> None:
        self.shutdown()
        self.wait()
        self._digesting.join()  # it stops at its next batch of rows

    def __enter__(self) -> DataServer:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close()


class _Closing(Exception):
    """The server closed while it took its digests."""


def _placed(index: int, row: int, batch: pa.RecordBatch) -> bytes:
    """What a message of rows is, for its MAC: its place in the stream, its rows and its columns' types."""
    types = "|".join(f"{column.name}:{column.type}" for column in batch.schema)
    return struct.pack("<QQQ", index, row, batch.num_rows) + types.encode()


def _read_batches(dataset: Dataset, start: int, stop: int, rows: int, record: bool = True
                  ) -> Iterator[pa.RecordBatch]:
    """Rows [start, stop) of a local dataset as stored, in record batches of at most `rows` rows; only the
    row groups that overlap the range are read (and, with `record`, listed in `dataset.opened`)."""
    first = 0  # dataset row of the current file's first row
    for info in dataset.files:
        lo, hi = max(start, first), min(stop, first + info.rows)
        if lo < hi:
            with dataset._filesystem.open_input_file(f"{dataset._root}/{info.name}") as handle:
                parquet = pq.ParquetFile(handle)
                group_first = first
                for group, group_rows in enumerate(info.row_groups):
                    a, b = max(lo, group_first), min(hi, group_first + group_rows)
                    if a < b:
                        if record:
                            dataset.opened.append((info.name, group))
                        at = group_first  # dataset row of the next batch's first row
                        for batch in parquet.iter_batches(batch_size=rows, row_groups=[group], columns=COLUMNS,
                                                          use_threads=False):
                            x, y = max(a, at), min(b, at + batch.num_rows)
                            if x < y:
                                yield batch.slice(x - at, y - x)
                            at += batch.num_rows
                            if at >= b:
                                break
                    group_first += group_rows
        first += info.rows


def _file_schema(dataset: Dataset, info: FileInfo) -> pa.Schema:
    with dataset._filesystem.open_input_file(f"{dataset._root}/{info.name}") as handle:
        schema = pq.ParquetFile(handle).schema_arrow
    return pa.schema([schema.field(column) for column in COLUMNS])


def _same_schema(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches in the first one's schema (files written apart may differ in the label's type); a read that
    fails midway ends the stream with the reason."""
    yield first
    try:
        for batch in rest:
            if batch.schema.equals(first.schema):
                yield batch
            else:
                yield from pa.Table.from_batches([batch]).cast(first.schema).combine_chunks().to_batches()
    except (OSError, pa.ArrowException, ValueError) as error:
        raise served_error(error) from None


def served_error(error: BaseException) -> flight.FlightError:
    """A failure to read a served dataset, as the reader is told it (a Flight error passes as it is)."""
    return error if isinstance(error, flight.FlightError) else flight.FlightServerError(f"cannot read: "
                                                                                        f"{first_line(error)}")


class RemoteDataset(Dataset):
    """A dataset another machine serves: its meta from the server, its rows streamed as they are read.

    `path` is the dataset's name in the job (the user's path), so every message names it as a local
    read would; the finite-value check and the label mapping are the local dataset's own. Every call
    is signed with `key` (the job's data stream key), every answer checked against it, and every
    row checked against its block's digest before it is given.
    """

    def __init__(self, path: str, meta: dict[str, Any], client: flight.FlightClient, address: str, key: bytes):
        super().__init__(path, meta)
        self.address = address
        self.bytes_received = 0
        self._client = client
        self._key = key
        self._bounds = block_bounds(self)
        self._options, self._short = call_options()

    def fingerprint(self) -> str:
        """The served dataset's own fingerprint: a share cached from it is reused only while it is unchanged."""
        return _call(self._client, self._key, FINGERPRINT_ACTION, self.path, self.address, self._short).decode()

    def _read_file(
        self, info: FileInfo, first: int, lo: int, hi: int, max_rows: int | None
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Rows [lo, hi) of one file, streamed: (dataset row, features, labels). A dropped connection asks
        again from the first row not yet given, after a pause, as a store read does."""
        failures = 0
        while True:
            try:
                for row, block, label in self._stream(info, lo, hi, max_rows):
                    yield row, block, label
                    lo, failures = row + len(block), 0
                if lo != hi:
                    raise DataError(f"{self.path}/{info.name}: the data server at {self.address} ended the rows "
                                    f"at row {lo - first + 1} of the file, not {hi - first}")
                return
            except RETRIED as error:
                failures = _after_failure(error, failures, self.path, self.address)
            except (flight.FlightError, pa.ArrowException, ValueError) as error:
                raise remote_error(self.path, self.address, error) from None

    def _stream(self, info: FileInfo, lo: int, hi: int, max_rows: int | None
                ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Rows [lo, hi), each given only once its block matched its digest: the whole blocks that hold them
        are asked for, and the rows outside [lo, hi) dropped once checked."""
        start, stop = widened(self._bounds, lo, hi)
        fields = {"path": self.path, "start": start, "stop": stop, "max_rows": max_rows}
        wire, request_id = signed_request(self._key, ROWS_METHOD, fields)
        reader = self._client.do_get(flight.Ticket(wire), self._options)
        checked, finished = CheckedRows(self._bounds, start), False
        try:
            for index in range(stop - start + 1):  # a message holds a row at least
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    finished = True
                    return
                batch, row = chunk.data, checked.position
                if batch is None:
                    raise unproven(self.path, self.address)  # the job's server sends rows in every message
                self.bytes_received += batch.nbytes
                if batch.num_rows > stop - row:
                    raise DataError(f"{self.path}: the data server at {self.address} sent more rows than asked for")
                given = self._signed_digests(request_id, index, row, batch, chunk.app_metadata)
                features = self._feature_block(batch.column("features"), batch.num_rows)
                try:
                    pieces = checked.add(features, batch.column("label"), given)
                except RowsDiffer as differ:
                    raise DataError(f"{self.path}/{info.name}: {differ} of the dataset, as the data server at "
                                    f"{self.address} sent them, differ from the digests it took of its files when it "
                                    "started (altered on the way, or misread there): none of them was used") from None
                for at, block, label in pieces:
                    a, b = max(at, lo), min(at + len(block), hi)
                    if a < b:
                        yield a, block[a - at: b - at], label[a - at: b - at]
            raise DataError(f"{self.path}: the data server at {self.address} sent more messages than rows")
        finally:
            if not finished:
                reader.cancel()  # a reader that stops early frees the server's side of the stream

    def _signed_digests(self, request_id: bytes, index: int, row: int, batch: pa.RecordBatch,
                        metadata: pa.Buffer | None) -> list[bytes]:
        """The digests of the blocks that begin in a message of rows, if the job's server signed them for this
        call and this place in the stream; a `DataError` otherwise."""
        content = b"" if metadata is None else metadata.to_pybytes()
        mac, given = content[:MAC_BYTES], content[MAC_BYTES:]
        if len(given) % DIGEST_BYTES or not answered_with_key(self._key, request_id, mac, _placed(index, row, batch),
                                                               given):
            raise unproven(self.path, self.address)
        return [given[at: at + DIGEST_BYTES] for at in range(0, len(given), DIGEST_BYTES)]

    def close(self) -> None:
        self._client.close()


def call_options() -> tuple[flight.FlightCallOptions, flight.FlightCallOptions]:
    """The options of a stream of rows (no time limit: a share takes as long as it takes) and of a short call."""
    return flight.FlightCallOptions(), flight.FlightCallOptions(timeout=CALL_SECONDS)


def unproven(path: str, address: str) -> DataError:
    """An answer without the job's MAC: whoever answered does not hold the job's secret."""
    return DataError(f"{path}: the data server at {address} did not prove it holds the job's secret (its answer "
                     "is not signed with it): another process answers at that port, so nothing it sent was used")


def remote_error(path: str, address: str, error: BaseException) -> DataError:
    """A Flight failure in one line, naming the dataset and the server."""
    if isinstance(error, DataError):
        return error
    if isinstance(error, flight.FlightUnauthenticatedError):
        return DataError(f"{path}: the data server at {address} refused the call: {_reason(error)}")
    return DataError(f"{path}: the data server at {address}: {_reason(error)}")


def _reason(error: BaseException) -> str:
    """What the server or gRPC said, without Flight's wrapping."""
    reason = first_line(error)
    for tail in (". Detail:", ". gRPC client debug context:"):
        reason = reason.split(tail)[0]
    if reason.startswith("Flight returned ") and ", with message: " in reason:
        reason = reason.split(", with message: ", 1)[1]
    return reason


def _after_failure(error: BaseException, failures: int, path: str, address: str) -> int:
    """Count one more failure to reach the server: pause before the next try and return the count, or, after
    `TRIES`, a `StoreError` (a restart may cure it, as it may a store's)."""
    failures += 1
    if failures >= TRIES:
        raise StoreError(f"{path}: the data server at {address} could not be reached in {TRIES} tries "
                         f"({_reason(error)}); this may be transient: run again") from None
    pause(failures)
    return failures


def _call(client: flight.FlightClient, key: bytes, action: str, path: str, address: str,
          options: flight.FlightCallOptions) -> bytes:
    """One short action about `path`, signed afresh at each try (tried again while the server cannot be
    reached for a moment); its answer, if the job's server signed it for this call."""
    failures = 0
    while True:
        wire, request_id = signed_request(key, action, {"path": path})
        try:
            results = [result.body.to_pybytes() for result in client.do_action(flight.Action(action, wire), options)]
        except RETRIED as error:
            failures = _after_failure(error, failures, path, address)
            continue
        except (flight.FlightError, pa.ArrowException) as error:
            raise remote_error(path, address, error) from None
        if len(results) != 2 or not answered_with_key(key, request_id, results[1], results[0]):
            raise unproven(path, address)
        return results[0]


def open_remote(address: str, path: str, secret: str) -> RemoteDataset:
    """The dataset named `path` in the job, as the data server at `address` ("host:port") serves it."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DataError(f"{path}: the data server's address {address!r} is not host:port")
    key, short = stream_key(secret), call_options()[1]
    try:
        client = flight.FlightClient(f"grpc+tcp://{address}")
    except (flight.FlightError, pa.ArrowException) as error:
        raise remote_error(path, address, error) from None
    try:
        content = _call(client, key, META_ACTION, path, address, short)
        meta = json.loads(content.decode("utf-8"))
        check_meta(meta, f"{path}/{META_FILE} (served by {address})")
        return RemoteDataset(path, meta, client, address, key)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        client.close()
        raise DataError(f"{path}/{META_FILE} (served by {address}): corrupt: {error}") from None
    except BaseException:
        client.close()
        raise
