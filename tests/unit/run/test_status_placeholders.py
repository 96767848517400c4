"""`shoal status` and `shoal report` say what a run's events hold and plainly what they do not: no `?` stands
in for a field a record lacks (a run killed before job_start, a failure without an exit code, a record written
by hand or by an older shoal), and where cluster.balance shares the rows by speed, each worker's share shows."""

from __future__ import annotations

import re

import pytest

from shoal.cli import main
from shoal.events import WorkerFailed
from shoal.run.report import write_report
from shoal.run.status import render, summarize
from tests.unit.run.test_status_report import epoch_end, job_start, write_events

PLACEHOLDER = re.compile(r"(?<![\w)])\?|\? ")
"""A `?` standing for a value: alone, or before a space (`exit code ?`, `epoch 0/?`, `| ? |`); the state
`stalled?` and a question's mark after a word are not placeholders."""


def placeholders(text: str) -> list[str]:
    return [line for line in text.splitlines() if PLACEHOLDER.search(line)]


@pytest.fixture
def never_started(tmp_path):
    """A node's launcher lost before the coordinator wrote job_start: the failure holds a host, no rank and no
    exit code (as shoal's supervisor records a node that stopped answering)."""
    return write_events(tmp_path / "never", [
        {"event": "worker_failed", "time": 100.0, "host": "vm", "message": "its launcher stopped answering"},
        {"event": "job_end", "time": 101.0, "status": "failed", "message": "vm (node 1): its launcher stopped "
                                                                          "answering"},
    ])


@pytest.fixture
def raised(tmp_path):
    """A worker's own error: the failure has a rank and a host but no exit code, and the job's end repeats it
    as the launcher wrote it (WorkerFailed.text())."""
    failure = WorkerFailed(rank=1, host="host-1", message="ValueError: bad")
    return write_events(tmp_path / "raised", [
        job_start(100.0, 2),
        {"event": "worker_failed", "time": 105.0, "rank": 1, "host": "host-1", "message": "ValueError: bad"},
        {"event": "job_end", "time": 106.0, "status": "failed", "message": failure.text()},
    ])


@pytest.fixture
def sparse(tmp_path):
    """Records that lack fields: a job_start with only its name, a worker without its host, a progress record
    without the epoch's steps, a restart without the epochs it redoes, and a job_end without its status."""
    worker = {**epoch_end(1, 110.0, 10.0, [5.0, 6.0], 0.7)}
    worker["workers"] = [{key: value for key, value in part.items() if key != "host"} for part in worker["workers"]]
    return write_events(tmp_path / "sparse", [
        {"event": "job_start", "time": 100.0, "job": "demo"},
        worker,
        {"event": "job_restarted", "time": 111.0, "restart": 1, "from_epoch": 1},
        {"event": "progress", "time": 115.0, "epoch": 2, "step": 125, "step_in_epoch": 25},
        {"event": "job_end", "time": 116.0},
    ])


def test_a_run_killed_before_job_start_says_so(never_started):
    text = render(summarize(never_started, now=1_000.0))
    assert "the job had not started: no job_start event yet" in text
    assert "last failure: vm: its launcher stopped answering" in text
    assert "epoch 0/" not in text and "algorithm" not in text
    assert placeholders(text) == []


def test_the_report_of_a_run_killed_before_job_start_says_so(never_started):
    text = write_report(never_started).read_text()
    assert "| job | the job had not started: no job_start event yet |" in text
    assert "- worker failed: vm: its launcher stopped answering" in text
    for unknown in ("| algorithm |", "| world size |", "| hosts |", "| device |", "| versions |"):
        assert unknown not in text
    assert placeholders(text) == []


def test_a_failure_without_an_exit_code_says_what_it_holds(raised):
    text = render(summarize(raised, now=1_000.0))
    assert "  rank 1 (host-1): ValueError: bad\n" in text  # the job's end, written with a `?`, told plainly
    assert "last failure: rank 1 (host-1): ValueError: bad" in text
    assert placeholders(text) == []
    report = write_report(raised).read_text()
    assert "**failed**: rank 1 (host-1): ValueError: bad." in report
    assert "- worker failed: rank 1 (host-1): ValueError: bad" in report
    assert placeholders(report) == []


def test_failure_text_tells_what_is_known():
    assert WorkerFailed(rank=1, host="h", exit_code=-9, signal="SIGKILL", message="killed").text() == \
        "rank 1 (h) exit code -9 (SIGKILL): killed"
    assert WorkerFailed(rank=1, host="h", signal="SIGTERM").text() == "rank 1 (h) stopped by SIGTERM"
    assert WorkerFailed(rank=1).text() == "rank 1, exit code not recorded"
    assert WorkerFailed(host="?", message="the workers failed").text() == "a worker: the workers failed"
    assert WorkerFailed().text() == "a worker, exit code not recorded"


def test_records_without_their_fields_leave_those_fields_out(sparse):
    summary = summarize(sparse, now=1_000.0)
    assert summary.state == "ended (status not recorded)"
    text = render(summary)
    assert "job demo\n" in text and "world size" not in text
    assert "workers  rank 0 5.0 steps/s  <- slowest\n         rank 1 6.0 steps/s\n" in text
    assert placeholders(text) == []
    report = write_report(sparse).read_text()
    assert "**ended (status not recorded)**." in report
    assert "- restart 1 from epoch 1's checkpoint\n" in report
    assert "| algorithm |" not in report and "| versions |" not in report
    assert placeholders(report) == []


def test_a_position_without_the_job_s_epoch_count_or_the_epoch_s_steps(sparse):
    lines = (sparse / "events.jsonl").read_text().splitlines(True)
    (sparse / "events.jsonl").write_text("".join(lines[:4]))  # before the job's end: the epoch under way
    text = render(summarize(sparse, now=116.0))
    assert "epoch 2 under way  step 125 (25 steps into this epoch)" in text and placeholders(text) == []
    (sparse / "events.jsonl").write_text("".join(lines[:2]))
    text = render(summarize(sparse, now=111.0))
    assert "epoch 1 done  step 100" in text and placeholders(text) == []


def test_machines_without_hosts_say_so(tmp_path):
    run = write_events(tmp_path / "elastic", [
        job_start(100.0, 2),
        {"event": "membership", "time": 100.5, "attempt": 0, "hosts": ["host-0", "host-1"], "workers": [1, 1],
         "world_size": 2},
        {"event": "membership", "time": 110.0, "attempt": 1, "workers": [1], "world_size": 1,
         "reason": "host-1 was lost", "from_epoch": 0},
    ])
    text = render(summarize(run, now=111.0))
    assert "machines hosts not recorded (1 worker) from the start: host-1 was lost" in text
    assert placeholders(text) == []


# ---------------------------------------------------------------- each worker's share

HOSTS = ["host0", "host1", "host2"]


def speed_epoch(epoch: int, rows: list[int], next_shares: list[int] | None) -> dict:
    """An epoch_end with cluster.balance = "speed": each worker's rows, rate and share, and the next shares."""
    record = epoch_end(epoch, 100.0 + 10 * epoch, 10.0, [5.0, 5.0, 5.0], 0.5)
    total = sum(rows)
    record["workers"] = [{**part, "host": HOSTS[rank], "rows": rows[rank], "rate": 100.0 * (2 if rank == 0 else 1),
                          "share": rows[rank] / total} for rank, part in enumerate(record["workers"])]
    return {**record, "balance": "speed", "next_shares": next_shares}


@pytest.fixture
def speed(tmp_path):
    """3 workers on 3 machines: equal shares in epoch 1, host0 twice as fast, so they move to 1/2, 1/4, 1/4
    after it; epoch 2 trains on them and keeps them."""
    return write_events(tmp_path / "speed", [
        {**job_start(100.0, 3), "world_size": 3, "trainers": 3, "hosts": HOSTS},
        speed_epoch(1, [1000, 1000, 1000], [1500, 750, 750]),
        speed_epoch(2, [1500, 750, 750], None),
    ])


def test_status_shows_each_workers_share(speed):
    text = render(summarize(speed, now=121.0))
    assert "shares   host0 50.0%, host1 25.0%, host2 25.0% (epoch 2)\n" in text
    assert placeholders(text) == []


def test_status_shows_the_next_epochs_rows_after_a_move(speed):
    lines = (speed / "events.jsonl").read_text().splitlines(True)
    (speed / "events.jsonl").write_text("".join(lines[:2]))
    text = render(summarize(speed, now=111.0))
    assert "shares   host0 33.3%, host1 33.3%, host2 33.3% (epoch 1); from epoch 2: host0 1,500, host1 750, " \
           "host2 750 rows\n" in text


def test_status_names_each_worker_of_a_machine_with_several(tmp_path):
    record = speed_epoch(1, [1000, 1000, 1000], None)
    for part, host in zip(record["workers"], ["host0", "host0", "host1"]):
        part["host"] = host
    run = write_events(tmp_path / "shared", [job_start(100.0, 2), record])
    text = render(summarize(run, now=111.0))
    assert "shares   host0 rank 0 33.3%, host0 rank 1 33.3%, host1 33.3% (epoch 1)\n" in text


def test_equal_shares_take_no_shares_line(tmp_path):
    record = {**speed_epoch(1, [1000, 1000, 1000], None), "balance": "equal"}
    text = render(summarize(write_events(tmp_path / "equal", [job_start(100.0, 2), record]), now=111.0))
    assert "shares " not in text


def test_report_lists_each_workers_share_per_epoch(speed):
    text = write_report(speed).read_text()
    section = text.split("## Shares\n", 1)[1].split("\n## ", 1)[0]
    assert section.strip().splitlines()[:4] == [
        "| epoch | shares of the rows | next epoch's rows |",
        "| --- | --- | --- |",
        "| 1 | host0 33.3%, host1 33.3%, host2 33.3% | host0 1,500, host1 750, host2 750 |",
        "| 2 | host0 50.0%, host1 25.0%, host2 25.0% | not moved |",
    ]
    assert placeholders(text) == []


def test_cli_status_and_report_show_the_shares(speed, capsys):
    assert main(["status", str(speed)]) == 0
    assert "shares   host0 50.0%, host1 25.0%, host2 25.0%" in capsys.readouterr().out
    assert main(["report", str(speed)]) == 0
    assert "## Shares" in (speed / "report.md").read_text()
