"""A worker's failure output: one line when it only lost a peer (the launcher names the one that failed),
the whole traceback for a failure of its own."""

from __future__ import annotations

import json

import pytest

from shoal import worker
from shoal.errors import CONSEQUENCE

GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:22914. This is typically caused by a remote worker crashing. Check the logs of the remote "
        "worker before reporting an error. GLHF!")


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    """No fault handler on the test's streams, no error file."""
    monkeypatch.setattr(worker.faulthandler, "enable", lambda **arguments: None)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)


def failing(error: BaseException):
    def run(argv=None):
        raise error
    return run


def test_a_lost_peer_is_one_line(monkeypatch, capsys):
    monkeypatch.delenv("SHOAL_DEBUG_LAUNCH", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(worker, "run", failing(RuntimeError(GLOO)))
    assert worker.main([]) == 1
    assert capsys.readouterr().err == ("shoal worker 0: stopping: another worker is gone "
                                       "(Connection closed by peer [127.0.0.1]:22914)\n")


@pytest.mark.parametrize("error", [ValueError("a bug of the worker's own"), RuntimeError("shape mismatch")])
def test_a_workers_own_failure_keeps_its_traceback(monkeypatch, error):
    monkeypatch.setattr(worker, "run", failing(error))
    with pytest.raises(type(error)):
        worker.main([])


def test_debugging_the_launch_keeps_a_lost_peers_traceback(monkeypatch):
    monkeypatch.setenv("SHOAL_DEBUG_LAUNCH", "1")
    monkeypatch.setattr(worker, "run", failing(RuntimeError(GLOO)))
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        worker.main([])


def test_a_worker_leaves_when_a_peer_stopped_answering(monkeypatch, capsys, tmp_path):
    """From the heartbeat's thread: the failure for its launcher (a consequence, naming the hung rank), one line,
    and the process ends (here: the status it would end with)."""
    ended = []
    monkeypatch.setattr(worker, "end_process", ended.append)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    worker.leave_for_stalled_peer(0, None)({"rank": 1, "host": "box1", "step": 67, "silent_for": 31.2})
    said = "worker rank 1 on box1 stopped answering at step 67 (no heartbeat for 31 s); rank 0 waited for it"
    assert ended == [1]
    assert capsys.readouterr().err == f"shoal worker 0: stopping: {said}\n"
    recorded = json.loads((tmp_path / "error.json").read_text())
    # the hung rank is the cause, not this one
    assert recorded["message"]["message"] == f"PeerLost: {said}" and recorded[CONSEQUENCE] is True
