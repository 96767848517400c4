"""Where a job's dataset is read from: here when this machine sees the path, else from the job's data server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shoal.data.flight import DataServer, RemoteDataset
from shoal.data.format import DatasetWriter
from shoal.data.source import SECRET_VARIABLE, SERVER_VARIABLE, open_source
from shoal.errors import DataError

SECRET = "the job's secret"


@pytest.fixture
def dataset(tmp_path) -> str:
    with DatasetWriter(str(tmp_path / "set"), (3,), np.float32) as writer:
        writer.write(np.arange(24, dtype=np.float32).reshape(8, 3), np.arange(8) % 2)
    return str(tmp_path / "set")


@pytest.fixture
def server(dataset):
    with DataServer({"/job/data/set": dataset}, SECRET, "127.0.0.1") as served:
        yield served


def test_a_path_this_machine_sees_is_read_here_even_with_a_server(dataset, server):
    environ = {SERVER_VARIABLE: f"127.0.0.1:{server.port}", SECRET_VARIABLE: SECRET}
    for path in (dataset, Path(dataset).as_uri()):
        opened = open_source(path, environ)
        assert not isinstance(opened, RemoteDataset) and opened.path == path
        assert opened.read_rows(0, 8)[0].sum() == sum(range(24))
    assert server.bytes_sent == 0


def test_a_path_this_machine_lacks_is_streamed_from_the_jobs_server(dataset, server):
    environ = {SERVER_VARIABLE: f"127.0.0.1:{server.port}", SECRET_VARIABLE: SECRET}
    opened = open_source("/job/data/set", environ)
    assert isinstance(opened, RemoteDataset) and opened.path == "/job/data/set"
    np.testing.assert_array_equal(opened.read_rows(2, 5)[0], np.arange(6, 15, dtype=np.float32).reshape(3, 3))
    assert server.bytes_by_path["/job/data/set"] > 0
    opened.close()


def test_without_a_server_a_missing_path_is_not_found(tmp_path):
    with pytest.raises(DataError, match=r"absent: dataset not found$"):
        open_source(str(tmp_path / "absent"), {SECRET_VARIABLE: SECRET})


def test_a_server_without_the_jobs_secret_is_one_line(server):
    with pytest.raises(DataError, match=rf"^/job/data/set: not found on this machine, and the job's data server at "
                                        rf"127\.0\.0\.1:{server.port} needs the job's secret, which "
                                        f"{SECRET_VARIABLE} does not hold$"):
        open_source("/job/data/set", {SERVER_VARIABLE: f"127.0.0.1:{server.port}"})


def test_the_secret_variable_is_the_clusters():
    from shoal.cluster.store import SECRET_VARIABLE as CLUSTER_SECRET

    assert SECRET_VARIABLE == CLUSTER_SECRET
