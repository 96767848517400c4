"""An error in the user's own code keeps its traceback, with the user's file names and line numbers: code sent
by value gets its files back where it is read (cloudpickle names every function it writes `<dynamic-code>`),
the traceback starts at the user's first frame, and it travels to job_end (from the worker's error file under
shoal's launcher, from the store's exits under torchrun). The whole path, through real workers:
tests/processes/test_user_traceback.py."""

from __future__ import annotations

import json
import traceback

import pytest
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

import tests.support.broken_code as broken
from shoal.cluster.node.launch import describe_failure
from shoal.code import TRACEBACK_LINES, USER_TRACEBACK, load_code, user_traceback
from shoal.errors import UserCodeError, blamed
from shoal.events import JobEnd, parse, read_events, read_history, record_problem
from shoal.objects import save_object
from shoal.train.exits import Exit, ExitBook, record_outcome
from shoal.train.step import Step
from shoal.worker import record_failure

FILE = broken.__file__


def by_value(tmp_path, value, key: str = "train.step"):
    """`value` as a worker reads it back: written by value as shoal.fit writes it, read as the job names it."""
    save_object(value, tmp_path / f"{key}.pkl", key)
    return load_code(f"{key}.pkl", key, tmp_path)


def frames(function, *arguments) -> list[traceback.FrameSummary]:
    """The frames of the error `function` raises, below this test's call."""
    with pytest.raises(Exception) as raised:
        function(*arguments)
    return traceback.extract_tb(raised.value.__traceback__)[1:]


def places(found: list[traceback.FrameSummary]) -> list[tuple[str, str, str | None]]:
    return [(frame.filename, frame.name, frame.line) for frame in found]


def test_a_step_sent_by_value_names_the_user_s_file_and_lines(tmp_path):
    step = by_value(tmp_path, broken.step)
    assert step is not broken.step and step.__code__.co_filename == FILE  # read back from its file, not imported
    assert places(frames(step, None, 7)) == [
        (FILE, "step", "return nested(batch)"),
        (FILE, "nested", "return Raiser().method(value)"),  # a nested function, then a method of a class by value
        (FILE, "method", "return fail(value)"),
        (FILE, "fail", 'raise ValueError(f"my step is broken at {value}")')]


@pytest.mark.parametrize("name", ["decorated", "lambda_step"])
def test_decorated_functions_and_lambdas_name_their_file(tmp_path, name):
    step = by_value(tmp_path, getattr(broken, name))
    found = frames(step, None, 7)
    assert {frame.filename for frame in found} == {FILE}
    assert found[-1].line == 'raise ValueError(f"my step is broken at {value}")'


def test_code_not_written_in_the_module_s_file_is_not_named_after_it(tmp_path):
    """A function that exec made (as a dataclass makes its __init__) has the module's globals but not its lines:
    named after the module's file, its traceback would show the wrong lines."""
    step = by_value(tmp_path, broken.uses_exec_made)
    found = frames(step, None, 7)
    assert [(frame.filename, frame.name) for frame in found] == [(FILE, "uses_exec_made"),
                                                                  ("<dynamic-code>", "made_by_exec")]
    settings = by_value(tmp_path, broken.Settings, "train.settings")
    assert settings.__init__.__code__.co_filename != FILE


def test_the_user_s_traceback_starts_at_the_user_s_code(tmp_path):
    step = Step(by_value(tmp_path, broken.step))
    with pytest.raises(UserCodeError) as raised:
        step(None, 7)
    assert str(raised.value) == "train.step: ValueError: my step is broken at 7"
    lines = user_traceback(raised.value).splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1] == f'  File "{FILE}", line {broken.step.__code__.co_firstlineno + 6}, in step'  # not shoal's
    assert lines[-1] == "ValueError: my step is broken at 7"
    assert user_traceback(ValueError("not the user's code")) is None
    assert user_traceback(UserCodeError("train.step: no cause")) is None


def test_a_long_traceback_keeps_its_last_lines():
    def report(rows: int):
        raise ValueError("\n".join(f"bad row {row}" for row in range(rows)))

    with pytest.raises(UserCodeError) as raised, blamed("train.step"):
        report(100)
    whole = user_traceback(raised.value).splitlines()
    kept = user_traceback(raised.value, TRACEBACK_LINES).splitlines()
    assert len(whole) > TRACEBACK_LINES + 2 and len(kept) == TRACEBACK_LINES + 2
    assert kept[0] == whole[0] and kept[1] == f"  ... ({len(whole) - TRACEBACK_LINES} lines above left out)"
    assert kept[2:] == whole[-TRACEBACK_LINES:] and kept[-1] == "bad row 99"


def user_error(tmp_path) -> UserCodeError:
    with pytest.raises(UserCodeError) as raised:
        Step(by_value(tmp_path, broken.step))(None, 7)
    return raised.value


def test_the_worker_s_error_file_carries_it_to_shoal_s_launcher(tmp_path, monkeypatch):
    for rank, error in enumerate([user_error(tmp_path), RuntimeError("shoal's own failure")]):
        written = tmp_path / f"error-{rank}.json"
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(written))
        try:
            raise error
        except Exception as raised:  # as the worker records it, in its handler
            record_failure(raised)
        failure = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=2 - rank, error_file=str(written))
        described = describe_failure(ChildFailedError("shoal.worker", {rank: failure}))
        if rank == 0:
            assert described.user_traceback == user_traceback(error, TRACEBACK_LINES)
            assert f'File "{FILE}", line ' in described.user_traceback
            assert json.loads(written.read_text())["message"]["extraInfo"][USER_TRACEBACK] == described.user_traceback
        else:
            assert described.user_traceback is None


def test_under_torchrun_rank_0_records_the_blamed_worker_s_traceback(tmp_path):
    book = ExitBook(dist.HashStore(), attempt=0, world_size=2)
    book.write(Exit.of_error(0, "a", "[gloo/pair.cc:534] Connection closed by peer"))
    book.write(Exit.of_error(1, "b", "train.step: ValueError: broken", traceback="Traceback ...\nValueError: broken"))
    record_outcome(tmp_path, book, book.read(), restarts_left=0, launcher="torchrun")
    end = list(read_events(tmp_path))[-1]
    assert end["event"] == "job_end" and end["traceback"] == "Traceback ...\nValueError: broken"


def test_job_end_s_traceback_reads_back_and_older_runs_have_none(tmp_path):
    record = {"event": "job_end", "time": 1.0, "status": "failed", "message": "worker rank 0 failed",
              "traceback": "Traceback (most recent call last):\n  ...\nValueError: broken"}
    assert parse(record).traceback.endswith("ValueError: broken") and record_problem(record) is None
    assert parse({key: value for key, value in record.items() if key != "traceback"}).traceback is None
    assert record_problem(record | {"traceback": 5}) == "job_end.traceback must be text, got 5"
    (tmp_path / "events.jsonl").write_text(json.dumps(record) + "\n")
    assert read_history(tmp_path).end.traceback == record["traceback"]
    assert "traceback" not in JobEnd(status="completed").record()  # a completed job's record is as it was
