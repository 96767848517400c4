"""The job's data server in a process of its own, as on the first machine, read from this one: with the job's
secret the rows are the stored ones; a wrong secret and a recorded call played again are refused; a stranger
in the middle without the secret (here, on a thread) flipping a label gives one line and no wrong row (what
needs no process: tests/unit/data/test_flight_trust.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pyarrow.flight as flight
import pytest

from shoal.data.flight import open_remote
from shoal.data.format import open_dataset
from shoal.data.signing import signed_request, stream_key
from shoal.data.source import SECRET_VARIABLE
from shoal.errors import DataError
from tests.unit.data.test_flight_trust import GROUP, NAME, ROWS, SECRET, Relay, assert_local, labels_of, write

PATIENCE = 60.0  # seconds the server's process may take to start or to stop

SERVE = """
import os
import sys
from shoal.data.flight import DataServer

server = DataServer({sys.argv[1]: sys.argv[2]}, os.environ["SHOAL_JOB_SECRET"], "127.0.0.1")
print(server.port, flush=True)
sys.stdin.read()  # served until its input closes
print("closed" if server.close() else "stuck", flush=True)
"""


@pytest.fixture
def served(tmp_path, project_env) -> Iterator[tuple[str, str]]:
    """The data server's address, in a process of its own given the job's secret in its environment, and the
    dataset's folder."""
    local = write(tmp_path / "train", labels_of(ROWS))
    process = subprocess.Popen([sys.executable, "-c", SERVE, NAME, local], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**project_env, SECRET_VARIABLE: SECRET})
    try:
        port = process.stdout.readline().strip()
        assert port.isdigit(), process.stderr.read()
        yield f"127.0.0.1:{port}", local
        process.stdin.close()
        assert process.stdout.readline().strip() == "closed"
        assert process.wait(PATIENCE) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(PATIENCE)
        process.stdout.close()
        process.stderr.close()


@pytest.mark.timeout(90)
def test_a_server_in_its_own_process_answers_the_job_only_once_a_call_and_its_rows_are_checked(served):
    address, local = served
    remote = open_remote(address, NAME, SECRET)
    features, labels = remote.read_rows(0, ROWS)
    expected = open_dataset(local).read_rows(0, ROWS)
    np.testing.assert_array_equal(features, expected[0])
    np.testing.assert_array_equal(labels, expected[1])
    remote.close()
    with pytest.raises(DataError, match=rf"^{NAME}: the data server at {address} refused the call: the call is not "
                                        "signed with this job's secret"):
        open_remote(address, NAME, "another job's secret")
    client = flight.connect(f"grpc+tcp://{address}")
    recorded = flight.Ticket(signed_request(stream_key(SECRET), "rows",
                                            {"path": NAME, "start": 0, "stop": GROUP, "max_rows": None})[0])
    assert client.do_get(recorded).read_all().num_rows == GROUP
    with pytest.raises(flight.FlightUnauthenticatedError, match="answered once already"):
        client.do_get(recorded).read_all()
    client.close()


@pytest.mark.timeout(90)
def test_a_stranger_in_the_middle_flipping_a_label_gives_one_line_and_no_wrong_row(served):
    address, local = served
    with Relay(address, flip_at=50) as relay:
        remote = open_remote(f"127.0.0.1:{relay.port}", NAME, SECRET)
        given = []
        with pytest.raises(DataError, match=rf"^{NAME}/part-00000\.parquet: rows 41 to 80 of the dataset, as the data "
                                            rf"server at 127\.0\.0\.1:{relay.port} sent them, differ from the "
                                            "digests") as caught:
            for piece in remote.iter_rows(0, ROWS):
                given.append(piece)
        remote.close()
    assert "\n" not in str(caught.value)
    assert_local(given, local, 0)
    assert sum(len(block) for _, block, _ in given) == GROUP  # rows 1 to 40: none of the altered block
