"""Launching without processes: the rendezvous endpoint, and turning worker failures into one message.

`describe_failure` is fed torch's own ChildFailedError and ProcessFailure objects; a worker that
raised leaves an error file in the format torch's ErrorHandler.record_exception writes (shoal's
worker writes the same, whole or not at all). Its
`consequence` tells the leader whether this node holds the cause or only felt another's failure.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ErrorHandler, ProcessFailure

from shoal.cluster.node.launch import describe_failure
from shoal.cluster.node.rendezvous import DEFAULT_PORT, Nodes
from shoal.cluster.signals import Interrupted
from shoal.errors import EXIT_USAGE, ConfigError, WorkerError
from shoal.events import WorkerFailed
from shoal.worker import record_failure

HOST = socket.gethostname()


# ---------------------------------------------------------------- the rendezvous endpoint


def test_a_single_machine_uses_loopback_and_any_port():
    assert Nodes().address() == ("127.0.0.1", 0)


def test_an_endpoint_is_split_into_host_and_port():
    assert Nodes(count=2, endpoint="head:29400").address() == ("head", 29400)


def test_an_endpoint_without_a_port_uses_the_default_port():
    assert Nodes(count=2, endpoint="head").address() == ("head", DEFAULT_PORT) == ("head", 29400)


def test_an_ipv6_endpoint_loses_its_brackets():
    assert Nodes(count=2, endpoint="[::1]:5").address() == ("::1", 5)


def test_an_endpoint_with_a_bad_port_is_a_config_error():
    with pytest.raises(ConfigError, match=r"--rdzv-endpoint: 'head:http' is not HOST:PORT"):
        Nodes(count=2, endpoint="head:http").address()


def test_many_nodes_without_an_endpoint_is_a_config_error():
    with pytest.raises(ConfigError, match=r"--rdzv-endpoint: HOST:PORT is required for a job of several machines"):
        Nodes(count=2, rank=0).address()


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
        """A worker whose exception was recorded (shoal.worker.record_failure, in torch's format)."""
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


def describe(failures: dict) -> WorkerError:
    return describe_failure(ChildFailedError("shoal.worker", failures))


def test_error_files_in_the_format_torch_writes_are_read(tmp_path, monkeypatch, failures):
    # the test's error file and shoal's worker's match what torch's ErrorHandler writes for an exception
    recorded = {}
    for writer in ("torch", "shoal"):
        written = tmp_path / f"recorded-{writer}.json"
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(written))
        try:
            raise ValueError("bad row 7")
        except ValueError as error:
            ErrorHandler().record_exception(error) if writer == "torch" else record_failure(error)
        recorded[writer] = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(written)).message
    ours = failures.raised(0, "ValueError: bad row 7").message
    assert recorded["torch"]["message"] == recorded["shoal"]["message"] == ours["message"] == "ValueError: bad row 7"
    assert set(recorded["torch"]["extraInfo"]) == set(recorded["shoal"]["extraInfo"]) == set(ours["extraInfo"])
    assert "bad row 7" in recorded["shoal"]["extraInfo"]["py_callstack"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["errors", "recorded-shoal.json", "recorded-torch.json"]


def test_a_failure_is_recorded_by_renaming_a_whole_file_into_place(tmp_path, monkeypatch):
    """The agent reads the file of every failed worker; torch's writer truncates it first, so a worker stopped
    mid-write left an empty file and the agent crashed on it. shoal's never opens the file itself."""
    written = tmp_path / "error.json"
    written.write_text("an earlier failure's file")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(written))
    opened = []
    real_open = open

    def watching_open(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", watching_open)
    record_failure(RuntimeError("gloo: connection closed by peer"))
    assert str(written) not in opened
    assert json.loads(written.read_text())["message"]["message"] == "RuntimeError: gloo: connection closed by peer"
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE")
    record_failure(RuntimeError("not under torch's agent"))  # nowhere to write: nothing written, no error
    assert [path.name for path in tmp_path.iterdir()] == ["error.json"]


def test_a_single_raised_worker_gives_its_first_line_and_failure(failures):
    error = describe({1: failures.raised(1, "RuntimeError: loss is nan\nat step 40")})
    assert isinstance(error, WorkerError)
    assert str(error) == f"worker rank 1 on {HOST} failed: RuntimeError: loss is nan"
    assert error.exit_code == 1
    assert error.failure == WorkerFailed(rank=1, host=HOST, exit_code=1, signal=None,
                                         message="RuntimeError: loss is nan")


def test_a_usage_error_keeps_exit_code_2(failures):
    error = describe({0: failures.raised(0, "ConfigError: train.batch_size: must be positive", exitcode=EXIT_USAGE)})
    assert error.exit_code == EXIT_USAGE == 2
    assert error.failure.exit_code == 2
    assert str(error).endswith("failed: ConfigError: train.batch_size: must be positive")


def test_other_exit_codes_become_1(failures):
    error = describe({0: failures.raised(0, "OSError: disk full", exitcode=3)})
    assert error.exit_code == 1
    assert error.failure.exit_code == 3


def test_a_worker_killed_by_sigkill_is_named_with_the_signal(failures):
    error = describe({2: failures.killed(2, signal.SIGKILL)})
    assert str(error) == f"worker rank 2 on {HOST} failed: killed by SIGKILL"
    assert error.exit_code == 1
    assert error.failure == WorkerFailed(rank=2, host=HOST, exit_code=-9, signal="SIGKILL",
                                         message="killed by SIGKILL")


def test_an_exit_without_an_error_file_gives_the_exit_status(tmp_path, failures):
    failure = ProcessFailure(local_rank=0, pid=5, exitcode=7, error_file=str(tmp_path / "absent.json"))
    error = describe({0: failure})
    # torch fills in a message pointing at its docs; shoal shows it as it is
    assert str(error).startswith(f"worker rank 0 on {HOST} failed: ")
    assert error.failure.exit_code == 7 and error.failure.signal is None


def test_a_worker_that_raised_is_preferred_over_one_that_lost_its_peer(failures):
    now = int(time.time())
    error = describe({0: failures.raised(0, "RuntimeError: Connection closed by peer [127.0.0.1]:4321", when=now - 5),
                      1: failures.raised(1, "ValueError: label 9 out of range", when=now)})
    assert str(error) == f"worker rank 1 on {HOST} failed: ValueError: label 9 out of range"
    assert error.failure.rank == 1


@pytest.mark.parametrize("consequence", ["Connection reset by peer", "Connection closed by peer",
                                         "remote process exited", "NCCL communicator was aborted",
                                         "DistBackendError: gloo"])
def test_lost_peer_messages_are_consequences(failures, consequence):
    now = int(time.time())
    error = describe({0: failures.raised(0, f"RuntimeError: {consequence}", when=now - 3),
                      3: failures.raised(3, "KeyError: 'x'", when=now)})
    assert error.failure.rank == 3


def test_when_every_worker_lost_its_peer_the_first_is_named(failures):
    now = int(time.time())
    error = describe({1: failures.raised(1, "RuntimeError: Connection reset by peer", when=now),
                      0: failures.raised(0, "RuntimeError: Connection closed by peer", when=now - 1)})
    assert str(error) == f"worker rank 0 on {HOST} failed: RuntimeError: Connection closed by peer"


def test_the_earliest_of_several_raised_workers_is_named(failures):
    now = int(time.time())
    error = describe({0: failures.raised(0, "ValueError: second", when=now),
                      1: failures.raised(1, "ValueError: first", when=now - 2)})
    assert error.failure.rank == 1 and error.failure.message == "ValueError: first"


# ProcessFailure gives a worker without an error file error_file_data == {"message": "<NONE>"} (not
# empty): only a recorded exception (a dict message) counts as a worker that raised.
def test_a_worker_that_raised_is_preferred_over_one_killed_in_the_same_second(failures):
    killed = failures.killed(0, signal.SIGTERM)  # stopped by the agent after rank 1 failed
    raised = failures.raised(1, "ValueError: label 9 out of range", when=killed.timestamp)
    error = describe({0: killed, 1: raised})
    assert error.failure.rank == 1


def test_a_sigtermed_worker_is_not_blamed_over_a_sigkilled_one(failures):
    terminated = failures.killed(0, signal.SIGTERM)
    killed = failures.killed(1, signal.SIGKILL)
    killed.timestamp = terminated.timestamp + 1  # the agent's SIGTERM came first, in the record
    error = describe({0: terminated, 1: killed})
    assert str(error) == f"worker rank 1 on {HOST} failed: killed by SIGKILL"


def test_a_sigkilled_worker_is_named_over_a_sigtermed_one_when_it_failed_first(failures):
    killed = failures.killed(1, signal.SIGKILL)
    terminated = failures.killed(0, signal.SIGTERM)
    terminated.timestamp = killed.timestamp + 1
    error = describe({0: terminated, 1: killed})
    assert str(error) == f"worker rank 1 on {HOST} failed: killed by SIGKILL"
    assert error.failure.signal == "SIGKILL" and error.failure.exit_code == -9


def test_an_unnamed_signal_is_reported_by_its_number(failures):
    error = describe({0: failures.killed(0, 40)})
    assert error.failure.signal == "signal 40" and "killed by signal 40" in str(error)


# ---------------------------------------------------------------- consequences


def test_a_worker_that_raised_is_not_a_consequence(failures):
    assert describe({0: failures.raised(0, "ValueError: label 9 out of range")}).consequence is False


def test_a_sigkilled_worker_is_not_a_consequence(failures):
    assert describe({0: failures.killed(0, signal.SIGKILL)}).consequence is False


def test_workers_that_only_lost_their_peers_are_a_consequence(failures):
    error = describe({0: failures.raised(0, "RuntimeError: Connection reset by peer"),
                      1: failures.raised(1, "RuntimeError: remote process exited")})
    assert error.consequence is True


def test_workers_stopped_by_sigterm_are_a_consequence(failures):
    assert describe({0: failures.killed(0, signal.SIGTERM), 1: failures.killed(1, signal.SIGTERM)}).consequence is True


def test_a_lost_peer_beside_a_sigtermed_worker_is_a_consequence(failures):
    error = describe({0: failures.raised(0, "RuntimeError: Connection closed by peer"),
                      1: failures.killed(1, signal.SIGTERM)})
    assert error.consequence is True


def test_one_raised_worker_among_sigtermed_ones_is_not_a_consequence(failures):
    error = describe({0: failures.killed(0, signal.SIGTERM), 1: failures.raised(1, "KeyError: 'x'")})
    assert error.consequence is False


def test_a_restart_is_told_in_one_line_with_where_it_goes_on_from():
    from shoal.cluster.node.launch import restart_line
    from shoal.events import JobRestarted

    failure = "worker rank 1 on node-a failed: killed by SIGKILL"
    assert restart_line(failure, JobRestarted(restart=1, from_epoch=2), 3) == (
        "shoal: worker rank 1 on node-a failed: killed by SIGKILL; restarting from epoch 2's checkpoint, "
        "restart 1 of 3")
    assert "restarting from the start (no checkpoint yet), restart 2 of 2" in restart_line(
        failure, JobRestarted(restart=2, from_epoch=0), 2)
