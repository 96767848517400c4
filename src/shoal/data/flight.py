"""Datasets served over Arrow Flight, for machines that have no copy of them.

A job's first machine holds its datasets; the others may share no folder with it. `DataServer`
serves the job's dataset folders from that machine, read-only, and `open_remote` opens one of
them elsewhere as a `Dataset` whose meta comes from the server and whose rows are streamed on
demand: a worker fetches only the rows of its share, as Arrow record batches holding exactly the
stored `features` and `label` values. Only the job's processes may read: every call carries a
token derived from the job's secret, checked in constant time before any method runs.

The server answers on gRPC's own threads from the moment it is built; it never calls Flight's
`serve()`, which would take over SIGINT and SIGTERM for the whole process (the launcher's own
handling of Ctrl-C must stay). Connection failures and refusals reach the user as one-line
`DataError`s naming the dataset and the server's address; a dropped connection is tried again
from the first row not yet received, as a store read is (`shoal.data.retry`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq

from shoal.data.format import META_FILE, Dataset, FileInfo, column_values, open_dataset
from shoal.data.meta import check_meta
from shoal.data.retry import TRIES, pause
from shoal.errors import DataError, ShoalError, StoreError, first_line

TOKEN_HEADER = "shoal-data-token"
TOKEN_LABEL = b"shoal data server"
SENT_BATCH_BYTES = 4 * 2**20  # the largest record batch sent: bounds both sides' memory per message
META_ACTION = "meta"
FINGERPRINT_ACTION = "fingerprint"
COLUMNS = ["features", "label"]
CALL_SECONDS = 60.0  # for the short calls (meta, fingerprint); a stream of rows takes as long as it needs
CLOSE_SECONDS = 10.0
RETRIED = (flight.FlightUnavailableError, flight.FlightTimedOutError)  # the server or the network, for a moment


def job_token(secret: str) -> str:
    """What every call to the job's data server carries: only the job's secret computes it, and it tells
    nothing of the secret (the secret's other uses in the job's store take other labels)."""
    return hmac.new(secret.encode(), TOKEN_LABEL, hashlib.sha256).hexdigest()


def normal_path(path: str) -> str:
    """A dataset's name as both sides compare it: a local path without a trailing or doubled slash."""
    path = str(path)
    return path if "://" in path else os.path.normpath(path)


class _TokenCheck(flight.ServerMiddlewareFactory):
    """Refuses every call that does not carry the job's token, before the method runs."""

    def __init__(self, token: str):
        super().__init__()
        self.token = token.encode()

    def start_call(self, info, headers):
        given = headers.get(TOKEN_HEADER) or [""]
        value = given[0].encode() if isinstance(given[0], str) else given[0]
        if not hmac.compare_digest(value, self.token):
            raise flight.FlightUnauthenticatedError("this call does not carry the job's token")
        return None


class DataServer(flight.FlightServerBase):
    """The job's datasets, served read-only to the job's processes on other machines.

    `datasets` maps each dataset's name as the job gives it (the user's path) to its folder here.
    Built, it answers at once on `host`:`port` (`port` 0: a free one, then in `.port`) until
    `close()`. Only `do_get` of a row range and the `meta` and `fingerprint` actions are answered.
    """

    def __init__(self, datasets: dict[str, str], secret: str, host: str, port: int = 0):
        if not secret:
            raise ValueError("the data server needs the job's secret")
        self.datasets: dict[str, Dataset] = {normal_path(name): open_dataset(folder)
                                             for name, folder in datasets.items()}
        self.host = host
        self.bytes_sent = 0
        self.bytes_by_path = dict.fromkeys(self.datasets, 0)
        self._count_lock = threading.Lock()
        self._closed = False
        bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host  # an IPv6 address
        super().__init__(f"grpc+tcp://{bracketed}:{port}", middleware={"token": _TokenCheck(job_token(secret))})

    def _dataset(self, name: Any) -> tuple[str, Dataset]:
        if not isinstance(name, str) or normal_path(name) not in self.datasets:
            raise flight.FlightServerError("not a dataset this server serves")
        return normal_path(name), self.datasets[normal_path(name)]

    def do_action(self, context, action):
        if action.type not in (META_ACTION, FINGERPRINT_ACTION):
            raise flight.FlightUnauthorizedError(f"action {action.type!r}: not offered (the server is read-only)")
        name, dataset = self._dataset(action.body.to_pybytes().decode("utf-8", "replace"))
        if action.type == META_ACTION:
            answer = json.dumps(dataset.meta).encode()
        else:
            try:
                answer = dataset.fingerprint().encode()
            except ShoalError as error:
                raise flight.FlightServerError(str(error)) from None
        self._count(name, len(answer))
        return [answer]

    def list_actions(self, context):
        return [(META_ACTION, "a served dataset's meta.json; body: its name"),
                (FINGERPRINT_ACTION, "a served dataset's fingerprint; body: its name")]

    def do_get(self, context, ticket):
        try:
            request = json.loads(ticket.ticket.decode("utf-8"))
            start, stop, max_rows = request["start"], request["stop"], request.get("max_rows")
        except (UnicodeDecodeError, ValueError, TypeError, KeyError):
            raise flight.FlightServerError("a ticket is JSON naming path, start and stop") from None
        name, dataset = self._dataset(request.get("path"))
        if not all(isinstance(value, int) and not isinstance(value, bool) for value in (start, stop)) \
                or not 0 <= start <= stop <= dataset.rows:
            raise flight.FlightServerError(f"rows [{start}, {stop}) outside 0..{dataset.rows}")
        row_bytes = dataset.features * dataset.feature_dtype.itemsize
        rows = max(1, SENT_BATCH_BYTES // row_bytes)
        if isinstance(max_rows, int) and not isinstance(max_rows, bool) and max_rows >= 1:
            rows = min(rows, max_rows)
        batches = self._counted(name, _read_batches(dataset, start, stop, rows))
        try:
            first = next(batches, None)  # a failure to open the files is the call's error, not the stream's
        except (OSError, pa.ArrowException, ValueError) as error:
            raise served_error(error) from None
        if first is None:
            return flight.RecordBatchStream(pa.table({column: [] for column in COLUMNS},
                                                     schema=_file_schema(dataset, dataset.files[0])))
        return flight.GeneratorStream(first.schema, _same_schema(first, batches))

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

    def __enter__(self) -> DataServer:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close()


def _read_batches(dataset: Dataset, start: int, stop: int, rows: int) -> Iterator[pa.RecordBatch]:
    """Rows [start, stop) of a local dataset as stored, in record batches of at most `rows` rows; only the
    row groups that overlap the range are read."""
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
    read would; the finite-value check and the label mapping are the local dataset's own.
    """

    def __init__(self, path: str, meta: dict[str, Any], client: flight.FlightClient, address: str, secret: str):
        super().__init__(path, meta)
        self.address = address
        self.bytes_received = 0
        self._client = client
        self._options, self._short = call_options(secret)

    def fingerprint(self) -> str:
        """The served dataset's own fingerprint: a share cached from it is reused only while it is unchanged."""
        return _call(self._client, FINGERPRINT_ACTION, self.path, self.address, self._short).decode()

    def _read_file(
        self, info: FileInfo, first: int, lo: int, hi: int, max_rows: int | None
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Rows [lo, hi) of one file, streamed: (dataset row, features, labels). A dropped connection asks
        again from the first row not yet given, after a pause, as a store read does."""
        failures = 0
        while True:
            try:
                for block, label in self._stream(lo, hi, max_rows):
                    yield lo, block, label
                    lo, failures = lo + len(block), 0
                if lo != hi:
                    raise DataError(f"{self.path}/{info.name}: the data server at {self.address} ended the rows "
                                    f"at row {lo - first + 1} of the file, not {hi - first}")
                return
            except RETRIED as error:
                failures = _after_failure(error, failures, self.path, self.address)
            except (flight.FlightError, pa.ArrowException, ValueError) as error:
                raise remote_error(self.path, self.address, error) from None

    def _stream(self, lo: int, hi: int, max_rows: int | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        ticket = {"path": self.path, "start": lo, "stop": hi, "max_rows": max_rows}
        reader = self._client.do_get(flight.Ticket(json.dumps(ticket).encode()), self._options)
        finished = False
        try:
            while True:
                try:
                    batch = reader.read_chunk().data
                except StopIteration:
                    finished = True
                    return
                self.bytes_received += batch.nbytes
                if batch.num_rows > hi - lo:
                    raise DataError(f"{self.path}: the data server at {self.address} sent more rows than asked for")
                features = self._feature_block(batch.column("features"), batch.num_rows)
                yield features, column_values(batch.column("label"))
                lo += batch.num_rows
        finally:
            if not finished:
                reader.cancel()  # a reader that stops early frees the server's side of the stream

    def close(self) -> None:
        self._client.close()


def call_options(secret: str) -> tuple[flight.FlightCallOptions, flight.FlightCallOptions]:
    """The options of a stream of rows (no time limit: a share takes as long as it takes) and of a short call."""
    headers = [(TOKEN_HEADER.encode(), job_token(secret).encode())]
    return flight.FlightCallOptions(headers=headers), flight.FlightCallOptions(headers=headers, timeout=CALL_SECONDS)


def remote_error(path: str, address: str, error: BaseException) -> DataError:
    """A Flight failure in one line, naming the dataset and the server."""
    if isinstance(error, DataError):
        return error
    if isinstance(error, flight.FlightUnauthenticatedError):
        return DataError(f"{path}: the data server at {address} refused this job's token (is it another job's "
                         "server, or a worker without the job's secret?)")
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


def _call(client: flight.FlightClient, action: str, path: str, address: str,
          options: flight.FlightCallOptions) -> bytes:
    """One short action about `path`, tried again while the server cannot be reached for a moment."""
    failures = 0
    while True:
        try:
            results = list(client.do_action(flight.Action(action, path.encode()), options))
            return results[0].body.to_pybytes()
        except RETRIED as error:
            failures = _after_failure(error, failures, path, address)
        except (flight.FlightError, pa.ArrowException, IndexError) as error:
            raise remote_error(path, address, error) from None


def open_remote(address: str, path: str, secret: str) -> RemoteDataset:
    """The dataset named `path` in the job, as the data server at `address` ("host:port") serves it."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DataError(f"{path}: the data server's address {address!r} is not host:port")
    short = call_options(secret)[1]
    try:
        client = flight.FlightClient(f"grpc+tcp://{address}")
    except (flight.FlightError, pa.ArrowException) as error:
        raise remote_error(path, address, error) from None
    try:
        content = _call(client, META_ACTION, path, address, short)
        meta = json.loads(content.decode("utf-8"))
        check_meta(meta, f"{path}/{META_FILE} (served by {address})")
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        client.close()
        raise DataError(f"{path}/{META_FILE} (served by {address}): corrupt: {error}") from None
    except BaseException:
        client.close()
        raise
    return RemoteDataset(path, meta, client, address, secret)
