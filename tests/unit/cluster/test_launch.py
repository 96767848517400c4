"""Launching without processes: the rendezvous arguments, and turning worker failures into one message.

`describe_failure` is fed torch's own ChildFailedError and ProcessFailure objects; a worker that
raised leaves an error file in the format torch's ErrorHandler.record_exception writes.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ErrorHandler, ProcessFailure

from shoal.cluster.heartbeat import HEARTBEATS
from shoal.cluster.launch import Interrupted, Nodes, describe_failure
from shoal.errors import EXIT_USAGE, ConfigError, WorkerError
from shoal.events import WorkerFailed

HOST = socket.gethostname()


# ---------------------------------------------------------------- rendezvous


def test_a_single_machine_uses_c10d_on_a_free_local_port():
    assert Nodes().rendezvous() == ("c10d", "127.0.0.1:0", {})


def test_many_nodes_with_a_node_rank_use_a_static_rendezvous():
    nodes = Nodes(count=2, rank=1, endpoint="head:29400")
    assert nodes.rendezvous() == ("static", "head:29400", {"rank": 1})
    assert Nodes(count=2, rank=0, endpoint="head:29400").rendezvous() == ("static", "head:29400", {"rank": 0})


def test_many_nodes_without_a_node_rank_use_c10d():
    assert Nodes(count=3, endpoint="head:29400").rendezvous() == ("c10d", "head:29400", {})


def test_a_named_backend_wins():
    assert Nodes(count=2, rank=1, endpoint="head:29400", backend="c10d").rendezvous() == ("c10d", "head:29400", {})
    assert Nodes(count=2, endpoint="head:2379", backend="etcd-v2").rendezvous() == ("etcd-v2", "head:2379", {})


def test_one_node_with_an_endpoint_uses_it():
    assert Nodes(count=1, endpoint="head:29400").rendezvous() == ("c10d", "head:29400", {})


def test_many_nodes_without_an_endpoint_is_a_config_error():
    with pytest.raises(ConfigError, match=r"--rdzv-endpoint: HOST:PORT is required when --nnodes > 1"):
        Nodes(count=2, rank=0).rendezvous()


# ---------------------------------------------------------------- signals


@pytest.mark.parametrize(("number", "code", "name"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_interrupted_exit_codes(number, code, name):
    error = Interrupted(int(number))
    assert error.exit_code == code
    assert error.signal is number
    assert str(error) == f"stopped by {name}"


# ---------------------------------------------------------------- failures


class Failures:
    """Builds torch's ProcessFailure objects as the elastic agent does, error files in a folder."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.folder.mkdir(exist_ok=True)

    def raised(self, rank: int, message: str, exitcode: int = 1, when: int | None = None) -> ProcessFailure:
        """A worker whose exception was recorded (shoal.worker records with torch's ErrorHandler)."""
        path = self.folder / f"error-{rank}.json"
        stamp = int(time.time()) if when is None else when
        extra = {"py_callstack": "Traceback ...", "timestamp": str(stamp)}
        path.write_text(json.dumps({"message": {"message": message, "extraInfo": extra}}))
        return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(path))

    def killed(self, rank: int, number: int) -> ProcessFailure:
        """A worker ended by a signal: no error file."""
        return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=-number,
                              error_file=str(self.folder / f"absent-{rank}.json"))


@pytest.fixture
def failures(tmp_path) -> Failures:
    return Failures(tmp_path / "errors")


def describe(failures: dict, run_dir: Path) -> WorkerError:
    return describe_failure(ChildFailedError("shoal.worker", failures), run_dir)


def test_error_files_in_the_format_torch_writes_are_read(tmp_path, monkeypatch, failures):
    # the test's error file matches what torch's ErrorHandler writes for a worker's exception
    written = tmp_path / "recorded.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(written))
    try:
        raise ValueError("bad row 7")
    except ValueError as error:
        ErrorHandler().record_exception(error)
    recorded = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(written))
    ours = failures.raised(0, "ValueError: bad row 7")
    assert recorded.message["message"] == ours.message["message"] == "ValueError: bad row 7"
    assert set(recorded.message["extraInfo"]) == set(ours.message["extraInfo"])


def test_a_single_raised_worker_gives_its_first_line_and_failure(tmp_path, failures):
    error = describe({1: failures.raised(1, "RuntimeError: loss is nan\nat step 40")}, tmp_path)
    assert isinstance(error, WorkerError)
    assert str(error) == f"worker rank 1 on {HOST} failed: RuntimeError: loss is nan"
    assert error.exit_code == 1
    assert error.failure == WorkerFailed(rank=1, host=HOST, exit_code=1, signal=None,
                                         message="RuntimeError: loss is nan")


def test_a_usage_error_keeps_exit_code_2(tmp_path, failures):
    error = describe({0: failures.raised(0, "ConfigError: train.batch_size: must be positive", exitcode=EXIT_USAGE)},
                     tmp_path)
    assert error.exit_code == EXIT_USAGE == 2
    assert error.failure.exit_code == 2
    assert str(error).endswith("failed: ConfigError: train.batch_size: must be positive")


def test_other_exit_codes_become_1(tmp_path, failures):
    error = describe({0: failures.raised(0, "OSError: disk full", exitcode=3)}, tmp_path)
    assert error.exit_code == 1
    assert error.failure.exit_code == 3


def test_a_worker_killed_by_sigkill_is_named_with_the_signal(tmp_path, failures):
    error = describe({2: failures.killed(2, signal.SIGKILL)}, tmp_path)
    assert str(error) == f"worker rank 2 on {HOST} failed: killed by SIGKILL"
    assert error.exit_code == 1
    assert error.failure == WorkerFailed(rank=2, host=HOST, exit_code=-9, signal="SIGKILL",
                                         message="killed by SIGKILL")


def test_an_exit_without_an_error_file_gives_the_exit_status(tmp_path, failures):
    failure = ProcessFailure(local_rank=0, pid=5, exitcode=7, error_file=str(tmp_path / "absent.json"))
    error = describe({0: failure}, tmp_path)
    # torch fills in a message pointing at its docs; shoal shows it as it is
    assert str(error).startswith(f"worker rank 0 on {HOST} failed: ")
    assert error.failure.exit_code == 7 and error.failure.signal is None


def test_a_worker_that_raised_is_preferred_over_one_that_lost_its_peer(tmp_path, failures):
    now = int(time.time())
    error = describe({0: failures.raised(0, "RuntimeError: Connection closed by peer [127.0.0.1]:4321", when=now - 5),
                      1: failures.raised(1, "ValueError: label 9 out of range", when=now)}, tmp_path)
    assert str(error) == f"worker rank 1 on {HOST} failed: ValueError: label 9 out of range"
    assert error.failure.rank == 1


@pytest.mark.parametrize("consequence", ["Connection reset by peer", "Connection closed by peer",
                                         "remote process exited", "NCCL communicator was aborted",
                                         "DistBackendError: gloo"])
def test_lost_peer_messages_are_consequences(tmp_path, failures, consequence):
    now = int(time.time())
    error = describe({0: failures.raised(0, f"RuntimeError: {consequence}", when=now - 3),
                      3: failures.raised(3, "KeyError: 'x'", when=now)}, tmp_path)
    assert error.failure.rank == 3


def test_when_every_worker_lost_its_peer_the_first_is_named(tmp_path, failures):
    now = int(time.time())
    error = describe({1: failures.raised(1, "RuntimeError: Connection reset by peer", when=now),
                      0: failures.raised(0, "RuntimeError: Connection closed by peer", when=now - 1)}, tmp_path)
    assert str(error) == f"worker rank 0 on {HOST} failed: RuntimeError: Connection closed by peer"


def test_the_earliest_of_several_raised_workers_is_named(tmp_path, failures):
    now = int(time.time())
    error = describe({0: failures.raised(0, "ValueError: second", when=now),
                      1: failures.raised(1, "ValueError: first", when=now - 2)}, tmp_path)
    assert error.failure.rank == 1 and error.failure.message == "ValueError: first"


# ProcessFailure gives a worker without an error file error_file_data == {"message": "<NONE>"} (not
# empty): only a recorded exception (a dict message) counts as a worker that raised.
def test_a_worker_that_raised_is_preferred_over_one_killed_in_the_same_second(tmp_path, failures):
    killed = failures.killed(0, signal.SIGTERM)  # stopped by the agent after rank 1 failed
    raised = failures.raised(1, "ValueError: label 9 out of range", when=killed.timestamp)
    error = describe({0: killed, 1: raised}, tmp_path)
    assert error.failure.rank == 1


def test_a_sigtermed_worker_is_not_blamed_over_a_sigkilled_one(tmp_path, failures):
    terminated = failures.killed(0, signal.SIGTERM)
    killed = failures.killed(1, signal.SIGKILL)
    killed.timestamp = terminated.timestamp + 1  # the agent's SIGTERM came first, in the record
    error = describe({0: terminated, 1: killed}, tmp_path)
    assert str(error) == f"worker rank 1 on {HOST} failed: killed by SIGKILL"


def test_a_sigkilled_worker_is_named_over_a_sigtermed_one_when_it_failed_first(tmp_path, failures):
    killed = failures.killed(1, signal.SIGKILL)
    terminated = failures.killed(0, signal.SIGTERM)
    terminated.timestamp = killed.timestamp + 1
    error = describe({0: terminated, 1: killed}, tmp_path)
    assert str(error) == f"worker rank 1 on {HOST} failed: killed by SIGKILL"
    assert error.failure.signal == "SIGKILL" and error.failure.exit_code == -9


def write_beat(run_dir: Path, rank: int, when: float, step: int, host: str = HOST) -> None:
    folder = run_dir / HEARTBEATS
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank-{rank:05d}.json").write_text(
        json.dumps({"rank": rank, "host": host, "step": step, "time": when, "pid": 4242 + rank}))


def test_the_rank_whose_heartbeat_went_quiet_first_is_named(tmp_path, failures):
    now = time.time()
    write_beat(tmp_path, 0, now, step=310)
    write_beat(tmp_path, 1, now - 0.4, step=310)
    write_beat(tmp_path, 2, now - 31.0, step=300, host="node-3")  # wedged: its collective never came
    timed_out = failures.raised(0, "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Read error: timed out")
    error = describe({0: timed_out}, tmp_path)
    assert str(error) == ("worker rank 2 on node-3 stopped answering at step 300 and was ended; the others waited "
                          "for it (rank 0: RuntimeError: [../gloo/transport/tcp/pair.cc:534] Read error: timed out)")
    assert error.failure == WorkerFailed(
        rank=2, host="node-3", exit_code=1, signal=None,
        message="RuntimeError: [../gloo/transport/tcp/pair.cc:534] Read error: timed out")
    assert error.exit_code == 1


def test_heartbeats_close_together_name_nobody(tmp_path, failures):
    now = time.time()
    write_beat(tmp_path, 0, now, step=12)
    write_beat(tmp_path, 1, now - 1.5, step=11)  # under the 2 s gap
    error = describe({1: failures.killed(1, signal.SIGKILL)}, tmp_path)
    assert str(error) == f"worker rank 1 on {HOST} failed: killed by SIGKILL"


def test_an_unnamed_signal_is_reported_by_its_number(tmp_path, failures):
    error = describe({0: failures.killed(0, 40)}, tmp_path)
    assert error.failure.signal == "signal 40" and "killed by signal 40" in str(error)
