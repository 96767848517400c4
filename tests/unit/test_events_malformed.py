"""A hand-edited or damaged events.jsonl: each malformed record is skipped with one warning naming the
file and its line (counted from 1), and `shoal status` and `shoal report` still answer, never a traceback."""

from __future__ import annotations

import json

import pytest

from shoal.cli import main
from shoal.events import EVENTS_FILE, read_history
from tests.unit.run.test_status_report import job_start, kept_epoch

HUGE = 10**400  # a JSON integer no float holds

MALFORMED = [
    ("epoch_end", {"epoch": "two"}),  # a string where an integer belongs
    ("epoch_end", {"train_loss": "low"}),  # a string where a number belongs
    ("epoch_end", {"test": ["loss", 0.5]}),  # a list where a table belongs
    ("epoch_end", {"test": {"loss": "high"}}),  # a table of the wrong values
    ("epoch_end", {"seconds_split": 3}),  # a number where a nested record belongs
    ("epoch_end", {"workers": [{"rank": "zero"}]}),  # a nested record with a wrong field
    ("epoch_end", {"workers": {"rank": 0}}),  # a table where a list belongs
    ("epoch_end", {"samples_per_second": HUGE}),  # a number past any float
    ("epoch_end", {"epoch": HUGE}),  # an integer past 64 bits
    ("epoch_end", {"epoch": True}),  # a boolean is not an integer
    ("epoch_end", {"epoch": None}),  # null where an integer belongs
    ("job_start", {"config": {"train": ["epochs"]}}),  # the job table, damaged inside
    ("job_start", {"hosts": "host-0"}),  # a string where a list belongs
    ("job_start", {"versions": {"shoal": 1}}),  # a table of numbers where text belongs
    ("job_end", {"status": 0}),  # a number where text belongs
    ("job_end", {"memory": [7]}),  # a list of numbers where records belong
    ("worker_failed", {"rank": [1]}),  # a list where an integer belongs
    ("checkpoint", {"path": {"folder": "x"}}),  # a table where text belongs
    ("progress", {"loss": "nan"}),  # a string where a number belongs
    ("data_loaded", {"per_rank": [1.0, "slow"]}),  # a list holding text where numbers belong
    ("validation", {"time": "noon"}),  # the time every record has, as text
]
NOT_RECORDS = ['[1, 2, 3]', '"epoch_end"', "42", "null", '{"event": "epoch_end", "epoch": 1', "not json at all"]


def damaged_run(tmp_path):
    """A valid three-epoch run with each malformed record, and each line that is no record, among them."""
    base = kept_epoch(1, 1011.0, [40.0, 38.0])
    lines = [json.dumps(job_start(1000.0, 3)), json.dumps(base)]
    bad_lines = []
    for kind, fields in MALFORMED:
        record = (job_start(1000.0, 3) if kind == "job_start" else base) | {"event": kind} | fields
        lines.append(json.dumps(record))
        bad_lines.append(len(lines))
    for text in NOT_RECORDS:
        lines.append(text)
        bad_lines.append(len(lines))
    for epoch, at in ((2, 1021.0), (3, 1031.0)):
        lines.append(json.dumps(kept_epoch(epoch, at, [40.0, 38.0])))
    lines.append(json.dumps({"event": "job_end", "time": 1032.0, "status": "completed", "epochs": 3,
                             "test": {"loss": 0.35, "accuracy": 0.9}}))
    lines.append(json.dumps({"event": "epoch_end", "time": 1033.0}))  # fields missing: their defaults
    run = tmp_path / "run"
    run.mkdir()
    (run / EVENTS_FILE).write_text("\n".join(lines) + "\n")
    return run, bad_lines


def test_every_malformed_record_is_skipped_with_one_warning_naming_its_line(tmp_path, capsys):
    run, bad_lines = damaged_run(tmp_path)
    assert len(bad_lines) >= 14
    history = read_history(run)
    warnings = capsys.readouterr().err.splitlines()
    assert [int(line.split(f"{EVENTS_FILE}: line ")[1].split(":")[0]) for line in warnings] == bad_lines
    assert all(line.startswith(f"shoal: warning: {run / EVENTS_FILE}: line ") for line in warnings)
    assert [epoch.epoch for epoch in history.latest_epochs()] == [0, 1, 2, 3]  # the one missing its fields: 0
    assert history.end.completed and history.start.configured_epochs() == 3


@pytest.mark.parametrize("command", ["status", "report"])
def test_status_and_report_answer_with_warnings_not_a_traceback(tmp_path, capsys, command):
    run, bad_lines = damaged_run(tmp_path)
    assert main([command, str(run)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert len(captured.err.splitlines()) == len(bad_lines)
    if command == "status":
        assert "completed" in captured.out
    else:
        assert (run / "report.md").is_file()


def run_ending_with(tmp_path, kind: str, fields: dict):
    """A run of a start and one epoch, then a record of `kind` with `fields` (line 3)."""
    base = kept_epoch(1, 1011.0, [40.0, 38.0])
    record = (job_start(1000.0, 3) if kind == "job_start" else base) | {"event": kind} | fields
    run = tmp_path / "run"
    run.mkdir()
    (run / EVENTS_FILE).write_text("".join(json.dumps(line) + "\n" for line in (job_start(999.0, 3), base, record)))
    return run


ODD_BUT_TYPED = [  # the right types, values no run writes: read as they are, and no division fails on them
    ("epoch_end", {"seconds": 0, "samples_per_second": 0, "epoch": -1}),
    ("epoch_end", {"seconds": 1e999, "train_loss": -1e999}),
    ("epoch_end", {"workers": [{"steps_per_second": 0}, {"steps_per_second": 0}]}),
    ("job_start", {"config": {"train": {"epochs": "three"}}, "steps_per_epoch": 0}),
    ("job_start", {"config": {"train": {"epochs": 10**300}}}),
]


@pytest.mark.parametrize(("kind", "fields"), ODD_BUT_TYPED)
def test_records_with_odd_values_do_not_crash_status_or_report(tmp_path, capsys, kind, fields):
    run = run_ending_with(tmp_path, kind, fields)
    assert main(["status", str(run)]) == 0
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("kind", "fields"), MALFORMED)
def test_each_malformed_record_alone_does_not_crash_status_or_report(tmp_path, capsys, kind, fields):
    run = run_ending_with(tmp_path, kind, fields)
    assert main(["status", str(run)]) == 0  # the report reads the same way: all of them at once above
    (warning,) = capsys.readouterr().err.splitlines()
    assert f"{EVENTS_FILE}: line 3: skipped: {kind}." in warning


def test_a_record_as_the_coordinator_writes_it_reads_without_a_warning(tmp_path, capsys):
    from shoal.config import JobConfig
    from shoal.events import JobStart, append_event
    from shoal.jobs import from_dict

    job: JobConfig = from_dict({"model": {"layers": [{"dense": 2}]}, "data": {"train": "t"}}, name="demo")
    append_event(tmp_path, JobStart(job=job.name, config=job.to_dict(), world_size=2, hosts=["a"]))
    assert read_history(tmp_path).start.configured_epochs() == 1
    assert capsys.readouterr().err == ""
