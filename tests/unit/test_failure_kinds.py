"""Failures told apart by type: a worker stopped by another's loss raises PeerLost, whatever its words say, and
its record carries that judgement to the launcher; a user's error that happens to say "timed out" stays the
user's error. Only torch's own RuntimeErrors of a lost peer are read by their text. A job's failure
(WorkerError) is apart from the user's input errors (ShoalError), and still one line and exit status 1."""

from __future__ import annotations

import json

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from shoal import cli, worker
from shoal.cluster.node.launch import describe_failure
from shoal.errors import (
    CONSEQUENCE,
    EXIT_USAGE,
    ConfigError,
    PeerLost,
    ShoalError,
    UserCodeError,
    WorkerError,
    blamed,
    lost_peer,
)
from shoal.train.exits import Exit

GLOO_TIMEOUT = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv"


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    """No fault handler on the test's streams; no launch debugging."""
    monkeypatch.setattr(worker.faulthandler, "enable", lambda **arguments: None)
    monkeypatch.delenv("SHOAL_DEBUG_LAUNCH", raising=False)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)


@pytest.mark.parametrize("words", ["worker rank 3 on node4 stopped answering at step 17; rank 0 waited for it",
                                   "any wording at all", ""])
def test_a_peer_lost_is_a_consequence_whatever_it_says(words):
    assert lost_peer(PeerLost(words))
    assert isinstance(PeerLost(words), RuntimeError)  # handlers of torch's lost-peer errors still catch it


@pytest.mark.parametrize("error", [ConfigError("data.train: the download timed out"),
                                   UserCodeError("train.step: TimeoutError: request timed out"),
                                   TimeoutError("timed out"), ValueError("Connection reset by peer"),
                                   RuntimeError("my step waited for it")])
def test_an_error_that_only_says_so_is_not_a_consequence(error):
    assert not lost_peer(error)


@pytest.mark.parametrize("said", [GLOO_TIMEOUT, "Connection closed by peer [127.0.0.1]:22914",
                                  "NCCL communicator was aborted"])
def test_torchs_own_lost_peer_errors_are_read_by_their_text(said):
    assert lost_peer(RuntimeError(said))


def recorded(tmp_path, monkeypatch, rank: int, error: BaseException) -> ProcessFailure:
    """A worker's failure as shoal.worker records it and torch's agent reads it back."""
    path = tmp_path / f"error-{rank}.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    worker.record_failure(error)
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=1, error_file=str(path))


def test_the_record_carries_the_judgement_to_the_launcher(tmp_path, monkeypatch):
    followed = recorded(tmp_path, monkeypatch, 0, PeerLost("any wording at all"))
    own = recorded(tmp_path, monkeypatch, 1, ConfigError("data.train: the download timed out"))
    assert json.loads((tmp_path / "error-0.json").read_text())[CONSEQUENCE] is True
    assert json.loads((tmp_path / "error-1.json").read_text())[CONSEQUENCE] is False
    error = describe_failure(ChildFailedError("shoal.worker", {0: followed, 1: own}))
    assert error.failure.rank == 1 and "the download timed out" in str(error)  # the user's error is the cause
    assert error.consequence is False


def test_a_node_whose_workers_only_lost_peers_holds_no_cause(tmp_path, monkeypatch):
    failures = {0: recorded(tmp_path, monkeypatch, 0, PeerLost("any wording at all")),
                1: recorded(tmp_path, monkeypatch, 1, RuntimeError(GLOO_TIMEOUT))}
    assert describe_failure(ChildFailedError("shoal.worker", failures)).consequence is True


def test_a_user_error_saying_timed_out_is_the_cause_over_a_peer_lost(tmp_path, monkeypatch):
    failures = {0: recorded(tmp_path, monkeypatch, 0, PeerLost("rank 0 waited for it")),
                1: recorded(tmp_path, monkeypatch, 1, ValueError("my lookup timed out"))}
    failures[1].timestamp = failures[0].timestamp + 5  # raised later, still the cause
    error = describe_failure(ChildFailedError("shoal.worker", failures))
    assert error.failure.rank == 1 and error.consequence is False


def test_a_worker_without_shoals_launcher_writes_its_judgement_into_its_exit():
    assert Exit.of_error(0, "a", "any wording at all", consequence=True).consequence
    assert not Exit.of_error(0, "a", "my lookup timed out", consequence=False).consequence
    assert Exit.of_error(0, "a", "[gloo/pair.cc:534] Connection closed by peer").consequence  # torch's words


def test_a_worker_stopped_by_a_peer_lost_says_one_line(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "2")

    def run(argv=None):
        raise PeerLost("worker rank 1 on box1 stopped answering at step 5; rank 2 waited for it")

    monkeypatch.setattr(worker, "run", run)
    assert worker.main([]) == 1
    assert capsys.readouterr().err.count("\n") == 1


def test_a_user_error_saying_timed_out_is_the_workers_own(monkeypatch, capsys, tmp_path):
    """The user's code raised (shoal wraps it, naming where): not taken for a lost peer, whatever it says."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))

    def run(argv=None):
        raise UserCodeError("train.step: TimeoutError: my lookup timed out")

    monkeypatch.setattr(worker, "run", run)
    assert worker.main([]) == EXIT_USAGE
    assert "another worker is gone" not in capsys.readouterr().err
    assert json.loads((tmp_path / "error.json").read_text())[CONSEQUENCE] is False


def test_a_jobs_failure_is_not_a_user_error():
    assert not issubclass(WorkerError, ShoalError) and WorkerError("x").exit_code == 1


def test_a_jobs_failure_passes_blamed_as_it_is():
    with pytest.raises(WorkerError), blamed("callbacks.on_epoch_end"):
        raise WorkerError("worker rank 1 on box1 failed: killed by SIGKILL")


@pytest.mark.parametrize(("error", "status"), [(WorkerError("worker rank 1 on box1 failed: killed by SIGKILL"), 1),
                                               (ConfigError("train.epochs: must be >= 1, got 0"), EXIT_USAGE)])
def test_the_command_line_ends_on_either_in_one_line(monkeypatch, capsys, error, status):
    def command(args):
        raise error

    monkeypatch.setattr(cli, "command_status", command)
    assert cli.main(["status", "run"]) == status
    assert capsys.readouterr().err == f"shoal: error: {error}\n"


def test_a_worker_ends_on_a_jobs_failure_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")

    def run(argv=None):
        raise WorkerError("could not reach the job's store at head:29400: Connection refused")

    monkeypatch.setattr(worker, "run", run)
    assert worker.main([]) == 1
    assert capsys.readouterr().err == ("shoal worker 0: error: could not reach the job's store at head:29400: "
                                       "Connection refused\n")


def test_torch_s_backend_error_and_torch_s_error_in_the_user_s_step_are_lost_peers():
    """torch's DistBackendError names its kind in its type only; a lost peer met inside the user's step arrives
    wrapped as the user's error, its cause torch's."""
    backend = type("DistBackendError", (RuntimeError,), {})("NCCL error in: x, unhandled system error")
    assert lost_peer(backend)
    try:
        with blamed("train.step"):
            raise RuntimeError("[gloo] Connection closed by peer [10.0.0.2]:1234")
    except UserCodeError as wrapped:
        assert lost_peer(wrapped)
    try:
        with blamed("train.step"):
            raise ValueError("the user's own words: timed out")
    except UserCodeError as wrapped:
        assert not lost_peer(wrapped)
