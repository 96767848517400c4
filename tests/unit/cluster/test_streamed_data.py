"""Which machine's data the first machine serves: real Meetings on loopback, each in a thread, no workers.

A machine that lacks a dataset of the job's says so with its claim; once the machines met, the first machine
starts its data server only if one did (in a fixed job as in one of changing machines), and a job where every
machine holds the data runs none: the port it writes is "".
"""

from __future__ import annotations

import re
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from shoal.cluster import keys
from shoal.cluster.node.rendezvous import Meeting, Nodes
from shoal.cluster.node.supervisor import NodeJob, data_port, serve_data
from shoal.config import ClusterConfig
from shoal.data.format import DatasetWriter
from shoal.errors import ConfigError

TIMEOUT = 10.0  # cluster.timeout for these meetings: far above what joining on loopback takes
WAIT = 30.0  # the most a test waits for a thread
SECRET = "0123456789abcdef0123456789abcdef"

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def met():
    """Two machines that met, node 0 and node 1, each saying whether it lacks the job's data: (first, other)."""
    opened: list[Meeting] = []

    def start(first_streams: bool = False, other_streams: bool = False) -> tuple[Meeting, Meeting]:
        port = free_port()
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(Meeting, Nodes(count=2, rank=rank, endpoint=f"127.0.0.1:{port}", secret=SECRET),
                                   TIMEOUT, 1, streamed=streams)
                       for rank, streams in enumerate((first_streams, other_streams))]
            meetings = [future.result(WAIT) for future in futures]
        opened.extend(meetings)
        return meetings[0], meetings[1]

    yield start
    for meeting in opened:
        meeting.close()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("streamed") / "train"
    generator = np.random.default_rng(0)
    with DatasetWriter(str(path), (4,), np.float32) as writer:
        writer.write(generator.standard_normal((64, 4), dtype=np.float32), generator.integers(0, 2, 64))
    return str(path)


def plan(datasets: list[str], streamed: bool = False, elastic: bool = False) -> NodeJob:
    return NodeJob(Path("job.toml"), Path("run"), ClusterConfig(workers=1, threads=1, timeout=TIMEOUT),
                   datasets=datasets, streamed=streamed, elastic=elastic)


def test_a_fixed_job_where_every_machine_holds_the_data_starts_no_data_server(met, dataset):
    first, other = met()
    assert first.streaming() == []
    assert serve_data(plan([dataset]), first) is None
    assert data_port(other, 1.0, dataset) == ""  # written at once: nobody waits for a request


def test_the_first_machine_of_a_fixed_job_serves_a_machine_that_lacks_the_data(met, dataset):
    first, other = met(other_streams=True)
    assert first.streaming() == [other.host]
    server = serve_data(plan([dataset]), first)
    try:
        assert server is not None and list(server.datasets) == [dataset]
        assert data_port(other, 1.0, dataset) == str(server.port)
    finally:
        if server is not None:
            server.close()


def test_the_first_machines_own_need_starts_no_server_for_the_others(met, dataset):
    """Node 0 lacking a dataset serves nobody: only the other machines' claims count."""
    first, other = met(first_streams=True)
    assert first.streaming() == []
    assert serve_data(plan([dataset]), first) is None


def test_a_job_of_changing_machines_serves_before_anyone_asks(met, dataset):
    """A machine that joins later may lack the data: the first machine serves what it holds from the start."""
    first, other = met()
    server = serve_data(plan([dataset], elastic=True), first)
    try:
        assert server is not None and data_port(other, 1.0, dataset) == str(server.port)
    finally:
        if server is not None:
            server.close()


def test_a_dataset_the_first_machine_lacks_too_is_refused_in_one_line(met, tmp_path):
    missing = str(tmp_path / "nowhere" / "train")
    first, other = met(other_streams=True)
    assert serve_data(plan([missing]), first) is None
    assert other.store.get(keys.DATA_PORT) == b""
    refusal = (rf"^{re.escape(missing)}: not on this machine \({other.host}\), and the first machine \(127.0.0.1\) "
               r"does not serve it \(it serves the other machines the datasets it holds\)$")
    with pytest.raises(ConfigError, match=refusal):
        serve_data(plan([missing], streamed=True), other)
