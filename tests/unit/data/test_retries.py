"""Transient store errors: reads from a store that fails now and then are tried again with backoff.

The store is a real pyarrow filesystem (`PyFileSystem`) over the local disk that fails the reads
it is told to with the errors an object store gives: plain `OSError`s.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from shoal.data import retry
from shoal.data.format import META_FILE, DatasetWriter, open_dataset
from shoal.data.loader import ShardLoader
from shoal.errors import DataError

ROWS = 40


class BreakingFile(io.RawIOBase):
    """A local file whose reads numbered in `failing` (1-based) fail as a dropped connection would."""

    def __init__(self, path: str, failing: set[int]):
        self.file = open(path, "rb")  # noqa: SIM115 (closed with this object)
        self.reads, self.failing = 0, failing

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()

    def readinto(self, buffer) -> int:
        self.reads += 1
        if self.reads in self.failing:
            raise ConnectionResetError("Connection reset by peer (store)")
        return self.file.readinto(buffer)

    def close(self) -> None:
        self.file.close()
        super().close()


class FlakyStore(pafs.FileSystemHandler):
    """The local disk, except that opening a path fails as `failures[name]` says, in order:
    an exception to raise, or a set of read numbers that fail once the file is open."""

    def __init__(self, failures: dict[str, list]):
        self.local = pafs.LocalFileSystem()
        self.failures = failures
        self.calls: dict[str, list[float]] = {}  # file name -> when each open was asked for

    def _next(self, path: str):
        name = Path(path).name
        self.calls.setdefault(name, []).append(time.monotonic())
        plan = self.failures.get(name, [])
        return plan.pop(0) if plan else None

    def open_input_stream(self, path: str):
        failure = self._next(path)
        if isinstance(failure, BaseException):
            raise failure
        return self.local.open_input_stream(path)

    def open_input_file(self, path: str):
        failure = self._next(path)
        if isinstance(failure, BaseException):
            raise failure
        return pa.PythonFile(BreakingFile(path, failure or set()), mode="r")

    def get_type_name(self) -> str:
        return "flaky"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def __eq__(self, other) -> bool:
        return self is other

    def __ne__(self, other) -> bool:
        return self is not other

    def _read_only(self, *args, **options):
        raise OSError("this store is read-only")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _read_only
    move = copy_file = open_output_stream = open_append_stream = _read_only


@pytest.fixture
def quick(monkeypatch):
    """Pauses of 10 ms instead of 0.5 s: the tests count tries, not seconds."""
    monkeypatch.setattr(retry, "FIRST_PAUSE", 0.01)


@pytest.fixture
def data(tmp_path) -> tuple[str, np.ndarray]:
    features = np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3)
    path = tmp_path / "set"
    with DatasetWriter(str(path), (3,), "float32", rows_per_file=20, row_group_size=4) as writer:
        writer.write(features, np.arange(ROWS) % 2)
    return str(path), features


def through(store: FlakyStore, path: str):
    return open_dataset(path, filesystem=pafs.PyFileSystem(store))


def dropped() -> OSError:
    return OSError("AWS Error NETWORK_CONNECTION during GetObject operation: connection reset")


def test_a_meta_read_failing_twice_is_tried_a_third_time(data, quick):
    path, _ = data
    store = FlakyStore({META_FILE: [dropped(), dropped()]})
    assert through(store, path).rows == ROWS
    assert len(store.calls[META_FILE]) == 3


def test_a_meta_read_failing_three_times_is_a_data_error_that_may_be_transient(data, quick):
    path, _ = data
    store = FlakyStore({META_FILE: [dropped(), dropped(), dropped()]})
    with pytest.raises(DataError) as caught:
        through(store, path)
    assert str(caught.value) == (f"{path}/{META_FILE}: store read failed 3 times (AWS Error NETWORK_CONNECTION "
                                 "during GetObject operation: connection reset); this may be transient: run again")
    assert len(store.calls[META_FILE]) == 3


def test_the_pauses_grow_from_half_a_second(data):
    path, _ = data
    store = FlakyStore({META_FILE: [dropped(), dropped()]})
    through(store, path)
    first, second, third = store.calls[META_FILE]
    assert 0.5 <= second - first < 0.9 and 1.0 <= third - second < 1.6


@pytest.mark.parametrize("error", [FileNotFoundError("gone"), PermissionError("denied"),
                                   IsADirectoryError("a folder")])
def test_an_error_about_the_path_itself_is_not_retried(data, quick, error):
    path, _ = data
    store = FlakyStore({"part-00001.parquet": [error]})
    dataset = through(store, path)
    with pytest.raises(DataError, match=r"^.*/set/part-00001\.parquet: cannot read Parquet file: "):
        dataset.read_all()
    assert len(store.calls["part-00001.parquet"]) == 1


def test_a_parquet_file_failing_to_open_twice_is_read_whole(data, quick):
    path, features = data
    store = FlakyStore({"part-00000.parquet": [dropped(), dropped()]})
    read, labels = through(store, path).read_all()
    np.testing.assert_array_equal(read, features)
    np.testing.assert_array_equal(labels, np.arange(ROWS) % 2)


def test_a_file_failing_in_the_middle_goes_on_where_it_stopped(data, quick):
    path, features = data
    # the first opening fails at its 4th read (the footer, then a column chunk a read), the second at its 3rd
    store = FlakyStore({"part-00001.parquet": [{4}, {3}]})
    dataset = through(store, path)
    read, _ = dataset.read_rows(10, ROWS)
    np.testing.assert_array_equal(read, features[10:])
    assert len(store.calls["part-00001.parquet"]) == 3
    groups = [group for name, group in dataset.opened if name == "part-00001.parquet"]
    assert groups == [0, 1, 2, 2, 3, 3, 4]  # each opening goes on from the row group that failed


def test_a_cached_share_read_in_batches_resumes_without_a_row_twice(data, quick, tmp_path):
    path, features = data
    store = FlakyStore({"part-00000.parquet": [{5}], "part-00001.parquet": [dropped(), {3}]})
    loader = ShardLoader(through(store, path), rank=0, world_size=1, batch_size=2, seed=0, memory_budget=500,
                         cache_dir=str(tmp_path / "cache"))
    assert loader.cache is not None
    np.testing.assert_array_equal(loader.features, features)
    np.testing.assert_array_equal(loader.labels, np.arange(ROWS) % 2)
    assert [len(store.calls[f"part-0000{n}.parquet"]) for n in (0, 1)] == [2, 3]  # every failure happened
    loader.close()


def test_a_parquet_file_failing_every_time_is_a_data_error_naming_it(data, quick):
    path, _ = data
    store = FlakyStore({"part-00001.parquet": [{2}, dropped(), {1}]})
    with pytest.raises(DataError) as caught:
        through(store, path).read_all()
    message = str(caught.value)
    assert message.startswith(f"{path}/part-00001.parquet: store read failed 3 times (")
    assert message.endswith("this may be transient: run again") and "\n" not in message
