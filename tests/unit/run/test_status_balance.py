"""`shoal status` and `shoal report` on machines of different speeds, from events files written by hand: each
machine's rows per second and share of the rows, and when speed shares moved; a run written before those
figures existed shows none of them."""

from __future__ import annotations

import pytest

from shoal.cli import main
from shoal.events import EpochEnd, WorkerEpoch, read_history
from shoal.run.report import plot_workers, write_report
from shoal.run.status import render, summarize, worker_rate
from tests.unit.run.test_status_report import epoch_end, job_start, write_events

ROWS = 3000
HOSTS = ["host-a", "host-a", "host-b"]  # ranks 0 and 1 on the fast machine, rank 2 on the slow one


def worker(rank: int, rows: int, rate: float, busy: float, steps: int = 10) -> dict:
    """A worker's part of a new `epoch_end` (compute 5/6 and data 1/6 of its busy seconds), as stored."""
    return {"rank": rank, "host": HOSTS[rank], "rows": rows, "seconds": 2.0, "steps_per_second": steps / 2.0,
            "compute": busy * 5 / 6, "communication": 2.0 - busy, "data": busy / 6, "rate": rate,
            "share": rows / ROWS}


def balanced_epoch(epoch: int, workers: list[dict], next_shares: list[int] | None) -> dict:
    return {"event": "epoch_end", "time": 1000.0 + 10 * epoch, "epoch": epoch, "step": 10 * epoch,
            "train_loss": 0.5, "test": {}, "samples": ROWS, "seconds": 2.0, "samples_per_second": ROWS / 2.0,
            "seconds_split": {"compute": 1.0, "communication": 0.5, "data": 0.3, "evaluation": 0.2},
            "workers": workers, "balance": "speed", "next_shares": next_shares}


@pytest.fixture
def balanced(tmp_path):
    """3 workers on 2 machines with cluster.balance = "speed": equal shares in epoch 1 show host-b at half
    host-a's workers' pace, so the shares move to 1200/1200/600 rows after it and stay. In epoch 3 rank 2's
    record holds no rate (0.0): it is its rows over its compute and data seconds, 600 / 0.6."""
    return write_events(tmp_path / "balanced", [
        {**job_start(1000.0, 3), "world_size": 3, "trainers": 3, "hosts": HOSTS},
        balanced_epoch(1, [worker(0, 1000, 2000.0, 0.5), worker(1, 1000, 2000.0, 0.5),
                           worker(2, 1000, 1000.0, 1.0, steps=9)], [1200, 1200, 600]),
        balanced_epoch(2, [worker(0, 1200, 2100.0, 1200 / 2100), worker(1, 1200, 1900.0, 1200 / 1900),
                           worker(2, 600, 1200.0, 0.5, steps=9)], None),
        balanced_epoch(3, [worker(0, 1200, 2000.0, 0.6), worker(1, 1200, 2000.0, 0.6),
                           worker(2, 600, 0.0, 0.6, steps=9)], None),
        {"event": "job_end", "time": 1040.0, "status": "completed", "test": {}, "seconds": 6.0, "epochs": 3,
         "steps": 30},
    ])


@pytest.fixture
def old_run(tmp_path):
    """2 workers on 2 machines, written before rates, shares and cluster.balance were recorded."""
    return write_events(tmp_path / "old", [
        job_start(1000.0, 2),
        epoch_end(1, 1010.0, 10.0, [40.0, 38.0], 0.6),
        epoch_end(2, 1020.0, 10.0, [41.0, 36.0], 0.5),
        {"event": "job_end", "time": 1021.0, "status": "completed", "test": {}, "seconds": 20.0, "epochs": 2,
         "steps": 200},
    ])


def test_status_shows_each_machines_rate_and_share_and_when_the_shares_moved(balanced):
    summary = summarize(balanced, now=1_000_000.0)
    assert summary.balance == "speed" and summary.shares_moved == [1]
    assert [(w.rank, w.rate, w.share) for w in summary.workers] == [
        (0, 2000.0, pytest.approx(0.4)), (1, 2000.0, pytest.approx(0.4)), (2, pytest.approx(1000.0), 0.2)]
    machines = summary.machines
    assert [(m.host, [w.rank for w in m.workers]) for m in machines] == [("host-a", [0, 1]), ("host-b", [2])]
    assert machines[0].rate == pytest.approx(4000.0) and machines[0].share == pytest.approx(0.8)
    assert machines[1].rate == pytest.approx(1000.0) and machines[1].share == pytest.approx(0.2)

    lines = render(summary).splitlines()
    workers = lines.index(next(line for line in lines if line.startswith("workers")))
    assert lines[workers:workers + 3] == [
        "workers  host-a  4,000 rows/s  80.0% of the rows  rank 0 5.0 steps/s, rank 1 5.0 steps/s",
        "         host-b  1,000 rows/s  20.0% of the rows  rank 2 4.5 steps/s  <- slowest",
        "balance  speed: shares moved after epoch 1",
    ]
    assert not any(line.startswith("         rank") for line in lines)  # one line per machine, not per worker


def test_status_after_the_first_epoch_shows_equal_shares_and_the_move(balanced):
    (balanced / "events.jsonl").write_text("".join((balanced / "events.jsonl").read_text().splitlines(True)[:2]))
    text = render(summarize(balanced, now=1011.0))
    assert "host-a  4,000 rows/s  66.7% of the rows  rank 0 5.0 steps/s, rank 1 5.0 steps/s" in text
    assert "host-b  1,000 rows/s  33.3% of the rows  rank 2 4.5 steps/s  <- slowest" in text
    assert "balance  speed: shares moved after epoch 1" in text


def test_an_old_run_shows_no_rate_share_or_balance(old_run):
    summary = summarize(old_run, now=1_000_000.0)
    assert summary.balance is None and summary.shares_moved == []
    assert all(w.rate is None and w.share is None for w in summary.workers)
    assert all(m.rate is None and m.share is None for m in summary.machines)
    text = render(summary)
    assert "rank 0 (host-0) 41.0 steps/s\n         rank 1 (host-1) 36.0 steps/s  <- slowest\n" in text
    for new in ("rows/s", "of the rows", "balance"):
        assert new not in text


def test_equal_shares_on_two_machines_show_their_rates_and_one_worker_keeps_its_line(tmp_path):
    two = {**balanced_epoch(1, [worker(0, 1500, 3000.0, 0.5), {**worker(2, 1500, 0.0, 0.0, steps=9), "compute": 0.0,
                                                                 "data": 0.0}], None), "balance": "equal"}
    run = write_events(tmp_path / "equal", [job_start(1000.0, 1), two])
    text = render(summarize(run, now=1011.0))
    # rank 2 measured nothing of its own work: its rate and its machine's are left out, never shown as 0
    assert "workers  host-a  3,000 rows/s  50.0% of the rows  rank 0 5.0 steps/s\n" in text
    assert "         host-b  50.0% of the rows  rank 2 4.5 steps/s  <- slowest\n" in text
    assert "balance  equal" in text
    one = {**balanced_epoch(1, [worker(0, ROWS, 3000.0, 1.0)], None), "balance": "equal"}
    run = write_events(tmp_path / "one", [job_start(1000.0, 1), one])
    text = render(summarize(run, now=1011.0))
    assert "workers  rank 0 (host-a) 5.0 steps/s\n" in text and "balance" not in text and "rows/s" not in text


def test_a_workers_rate_is_recorded_or_its_rows_over_its_own_work_or_unknown():
    assert worker_rate(WorkerEpoch(rows=600, rate=1500.0, compute=1.0, data=0.2)) == 1500.0
    assert worker_rate(WorkerEpoch(rows=600, compute=0.5, data=0.1)) == pytest.approx(1000.0)
    assert worker_rate(WorkerEpoch(rows=600)) is None
    assert worker_rate(WorkerEpoch(rows=600, rate=float("nan"), compute=float("nan"))) is None


def test_report_has_a_table_per_machine_and_the_epochs_the_shares_moved(balanced):
    text = write_report(balanced).read_text()
    section = text.split("## Machines\n", 1)[1].split("\n## ", 1)[0]
    lines = section.strip().splitlines()
    assert lines[:4] == [
        "| machine | ranks | mean rows/s | share, epoch 1 | share, epoch 3 |",
        "| --- | --- | --- | --- | --- |",
        "| host-a | 0, 1 | 4,000 | 66.7% | 80.0% |",
        "| host-b | 2 | 1,067 | 33.3% | 20.0% |",  # (1000 + 1200 + 600 / 0.6) / 3
    ]
    assert "Rows shared (cluster.balance): speed." in section
    assert "Speed shares moved after epoch 1 (to host-a 2,400, host-b 600 rows)." in section
    epochs = read_history(balanced).latest_epochs()
    assert len(plot_workers(epochs).axes) == 3  # steps/s per worker, rows/s and share per machine


def test_report_of_an_old_run_has_no_machine_table(old_run):
    text = write_report(old_run).read_text()
    assert "## Machines" not in text and "rows/s" not in text and "cluster.balance" not in text
    assert len(plot_workers(read_history(old_run).latest_epochs()).axes) == 1


def test_report_of_fixed_shares_says_so_and_lists_no_moves(tmp_path):
    fixed = {**balanced_epoch(1, [worker(0, 2000, 2000.0, 1.0), worker(2, 1000, 1000.0, 1.0)], None),
             "balance": "fixed"}
    text = write_report(write_events(tmp_path / "fixed", [job_start(1000.0, 1), fixed])).read_text()
    assert "| host-a | 0 | 2,000 | 66.7% |" in text and "| host-b | 2 | 1,000 | 33.3% |" in text
    assert "Rows shared (cluster.balance): fixed (cluster.balance's relative speeds)." in text
    assert "Speed shares moved" not in text


def test_cli_status_and_report_of_a_balanced_run(balanced, capsys):
    assert main(["status", str(balanced)]) == 0
    assert "balance  speed: shares moved after epoch 1" in capsys.readouterr().out
    assert main(["report", str(balanced)]) == 0
    assert "## Machines" in (balanced / "report.md").read_text()


def test_an_epoch_record_without_the_new_fields_reads_as_unknown():
    record = EpochEnd(workers=[WorkerEpoch(rank=0, rows=10)])
    assert record.balance is None and record.next_shares is None and record.workers[0].rate == 0.0


def test_a_record_with_shares_but_no_workers_shows_no_machine(tmp_path):
    empty = {**balanced_epoch(1, [], None), "balance": "speed"}
    run = write_events(tmp_path / "empty", [job_start(1000.0, 1), empty])
    text = render(summarize(run, now=1011.0))
    assert "workers" not in text and "balance" not in text
    assert "## Machines" not in write_report(run).read_text()
