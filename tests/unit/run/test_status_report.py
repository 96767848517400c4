"""`shoal status` and `shoal report` on events files written by hand: a finished run with a restart,
a running run, an empty folder."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from shoal.cli import main
from shoal.errors import ShoalError
from shoal.run.report import write_report
from shoal.run.status import STALL_SECONDS, render, summarize, watch

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def epoch_end(epoch: int, at: float, seconds: float, rates: list[float], train_loss: float,
              test: dict | None = None, steps_per_epoch: int = 100) -> dict:
    """An `epoch_end` record as stored (shaped like coordinator.epoch_record's)."""
    samples = 3200
    return {
        "event": "epoch_end", "time": at, "epoch": epoch, "step": epoch * steps_per_epoch,
        "train_loss": train_loss, "test": test or {}, "samples": samples, "seconds": seconds,
        "samples_per_second": samples / seconds,
        "seconds_split": {"compute": seconds * 0.6, "communication": seconds * 0.2, "data": seconds * 0.1,
                          "evaluation": seconds * 0.1},
        "workers": [{"rank": rank, "host": f"host-{rank}", "rows": samples // len(rates), "seconds": seconds,
                     "steps_per_second": rate, "compute": seconds * 0.6, "communication": seconds * 0.2,
                     "data": seconds * 0.1} for rank, rate in enumerate(rates)],
    }


def job_start(at: float, epochs: int) -> dict:
    return {"event": "job_start", "time": at, "job": "demo", "config": {"train": {"epochs": epochs}},
            "versions": {"shoal": "0.1.0", "torch": "2.13.0"}, "world_size": 2, "trainers": 2,
            "hosts": ["host-0", "host-1"], "threads": 1, "device": "cpu", "algorithm": "averaging",
            "train_rows": 3200, "test_rows": 800, "steps_per_epoch": 100, "parameters": 4321}


def write_events(folder: Path, records: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "events.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return folder


# epoch -> (seconds, train loss, test metrics) of the attempts the finished run keeps
KEPT = {
    1: (10.0, 0.6, {"loss": 0.55, "accuracy": 0.7, "auc": 0.75}),
    2: (12.0, 0.5, {"loss": 0.45, "accuracy": 0.8, "auc": 0.85}),
    3: (11.0, 0.4, {"loss": 0.35, "accuracy": 0.9, "auc": 0.95}),
}


def kept_epoch(epoch: int, at: float, rates: list[float]) -> dict:
    seconds, train_loss, test = KEPT[epoch]
    return epoch_end(epoch, at, seconds, rates, train_loss, test)


@pytest.fixture
def finished(tmp_path) -> Path:
    """3 epochs on 2 workers; rank 1 dies after epoch 2 ends but before its checkpoint, so the
    job restarts from epoch 1's checkpoint and trains epoch 2 again."""
    return write_events(tmp_path / "finished", [
        job_start(1000.0, 3),
        {"event": "data_loaded", "time": 1001.0, "seconds": 1.0, "per_rank": [1.0, 0.9]},
        kept_epoch(1, 1011.0, [40.0, 38.0]),
        {"event": "checkpoint", "time": 1011.5, "epoch": 1, "path": "checkpoints/epoch-1"},
        epoch_end(2, 1021.0, 9.0, [41.0, 39.0], 0.52, {"loss": 0.5, "accuracy": 0.78, "auc": 0.8}),
        {"event": "worker_failed", "time": 1021.2, "rank": 1, "host": "host-1", "exit_code": -9,
         "signal": "SIGKILL", "message": "killed by the kernel"},
        {"event": "job_restarted", "time": 1023.0, "restart": 1, "from_epoch": 1, "epochs_redone": 2},
        {**job_start(1024.0, 3), "event": "job_resumed", "from_epoch": 1},  # the relaunched coordinator's
        {"event": "data_loaded", "time": 1025.0, "seconds": 1.0, "per_rank": [1.0, 0.9]},
        kept_epoch(2, 1035.0, [42.0, 37.5]),
        {"event": "checkpoint", "time": 1035.5, "epoch": 2, "path": "checkpoints/epoch-2"},
        kept_epoch(3, 1047.0, [43.0, 36.0]),
        {"event": "checkpoint", "time": 1047.5, "epoch": 3, "path": "checkpoints/epoch-3"},
        {"event": "job_end", "time": 1048.0, "status": "completed", "test": KEPT[3][2], "seconds": 47.0,
         "epochs": 3, "steps": 300, "model": "model.pt"},
    ])


@pytest.fixture
def running(tmp_path) -> Path:
    """5 epochs, 2 done (20 s and 30 s), the third a quarter of the way through."""
    return write_events(tmp_path / "running", [
        job_start(2000.0, 5),
        {"event": "data_loaded", "time": 2001.0, "seconds": 1.0, "per_rank": [1.0, 1.0]},
        epoch_end(1, 2021.0, 20.0, [5.0, 6.0], 0.7),
        epoch_end(2, 2051.0, 30.0, [5.5, 5.0], 0.6, {"loss": 0.58, "accuracy": 0.66}),
        {"event": "progress", "time": 2060.0, "epoch": 3, "step": 225, "step_in_epoch": 25,
         "steps_per_epoch": 100, "loss": 0.41},
    ])


# ---------------------------------------------------------------- summarize and render


def test_finished_run_summary(finished):
    summary = summarize(finished, now=1_000_000.0)  # long after: a finished run is never "stalled?"
    assert summary.state == "completed"
    assert (summary.job, summary.algorithm, summary.world_size) == ("demo", "averaging", 2)
    assert (summary.epoch, summary.epochs, summary.step) == (3, 3, 300)
    assert summary.train_loss == KEPT[3][1]
    assert summary.test == KEPT[3][2]
    assert summary.samples_per_second == pytest.approx(3200 / KEPT[3][0])
    assert summary.eta_seconds is None and summary.elapsed_seconds == pytest.approx(1048.0 - 1000.0)
    assert [(w.rank, w.steps_per_second, w.slowest) for w in summary.workers] == [
        (0, 43.0, False), (1, 36.0, True)]
    assert summary.restarts == 1
    assert summary.last_failure.rank == 1 and summary.last_failure.signal == "SIGKILL"
    assert summary.checkpoints == 3 and summary.last_checkpoint.epoch == 3

    text = render(summary)
    assert "completed" in text and "job demo" in text and "algorithm averaging" in text
    assert "epoch 3/3 done  step 300" in text
    assert "train loss 0.4000" in text and "accuracy 0.9000" in text
    assert "rank 1 (host-1) 36.0 steps/s  <- slowest" in text
    assert "rank 0 (host-0) 43.0 steps/s\n" in text
    assert "restarts 1" in text and "SIGKILL" in text and "killed by the kernel" in text
    assert "checkpoints 3" in text and "eta" not in text


def test_running_run_summary_and_eta(running):
    summary = summarize(running, now=2065.0)
    assert summary.state == "running"
    assert (summary.epoch, summary.epochs, summary.step, summary.step_in_epoch) == (3, 5, 225, 25)
    mean_epoch = (20.0 + 30.0) / 2
    expected = (5 - 2) * mean_epoch - 25 / 100 * mean_epoch  # remaining epochs minus this epoch's progress
    assert summary.eta_seconds == pytest.approx(expected)
    assert summary.elapsed_seconds == pytest.approx(2065.0 - 2000.0)
    assert summary.train_loss == 0.6 and summary.step_loss == 0.41
    assert summary.test == {"loss": 0.58, "accuracy": 0.66} and summary.test_epoch == 2
    assert [w.slowest for w in summary.workers] == [False, True]
    assert summary.restarts == 0 and summary.last_failure is None and summary.checkpoints == 0

    text = render(summary)
    assert "running" in text and "epoch 3/5 under way  step 225 (25/100 in this epoch)" in text
    assert "eta 1m 09s" in text  # 68.75 s
    assert "rank 1 (host-1) 5.0 steps/s  <- slowest" in text
    assert "restarts 0" in text and "last failure" not in text


def test_first_epoch_eta_uses_its_pace(tmp_path):
    run = write_events(tmp_path / "first", [
        job_start(100.0, 4),
        {"event": "data_loaded", "time": 102.0, "seconds": 2.0, "per_rank": [2.0, 2.0]},
        {"event": "progress", "time": 112.0, "epoch": 1, "step": 50, "step_in_epoch": 50,
         "steps_per_epoch": 100, "loss": 0.9},
    ])
    summary = summarize(run, now=113.0)
    epoch_pace = (112.0 - 102.0) / 0.5  # 10 s for half an epoch
    assert summary.eta_seconds == pytest.approx((4 - 0.5) * epoch_pace)
    assert summary.workers == [] and summary.train_loss is None
    assert "epoch 1/4" in render(summary)


def test_quiet_run_is_stalled(running):
    summary = summarize(running, now=2060.0 + STALL_SECONDS + 1)
    assert summary.state == "stalled?" and summary.eta_seconds is None
    assert "stalled?" in render(summary)


def test_failed_run(tmp_path):
    run = write_events(tmp_path / "failed", [
        job_start(100.0, 2),
        {"event": "worker_failed", "time": 105.0, "rank": 0, "host": "host-0", "exit_code": 1, "signal": None,
         "message": "ValueError: bad"},
        {"event": "job_end", "time": 106.0, "status": "failed", "message": "worker 0 failed"},
    ])
    summary = summarize(run, now=10_000.0)
    assert summary.state == "failed" and summary.eta_seconds is None
    assert summary.elapsed_seconds == pytest.approx(106.0 - 100.0)
    text = render(summary)
    assert "failed" in text and "worker 0 failed" in text and "exit code 1: ValueError: bad" in text
    report = write_report(run).read_text()
    assert "**failed**: worker 0 failed." in report and "No epoch finished." in report
    assert not (run / "loss.png").exists()


def test_resumed_run_goes_on_from_its_checkpoint(tmp_path):
    run = write_events(tmp_path / "resumed", [
        job_start(100.0, 4),
        epoch_end(1, 110.0, 10.0, [5.0], 0.7),
        epoch_end(2, 120.0, 10.0, [5.0], 0.6),
        {"event": "job_end", "time": 121.0, "status": "interrupted", "message": "Ctrl-C"},
        {**job_start(500.0, 4), "event": "job_resumed", "from_epoch": 1, "world_size": 3},
    ])
    summary = summarize(run, now=501.0)
    assert summary.state == "running" and summary.epoch == 1 and summary.world_size == 3
    assert summary.eta_seconds == pytest.approx((4 - 1) * 10.0)
    assert summary.restarts == 0
    assert "- resumed from epoch 1's checkpoint" in write_report(run).read_text()


def test_not_a_run_directory(tmp_path):
    with pytest.raises(ShoalError, match="no events.jsonl: not a shoal run directory"):
        summarize(tmp_path)
    with pytest.raises(ShoalError, match="no events.jsonl: not a shoal run directory"):
        write_report(tmp_path)


def test_watch_redraws_until_the_job_ends(running):
    naps = []

    def sleep(seconds):  # the job finishes while the watcher sleeps
        naps.append(seconds)
        with open(running / "events.jsonl", "a") as handle:
            handle.write(json.dumps({"event": "job_end", "time": time.time(), "status": "completed", "test": {},
                                     "seconds": 100.0, "epochs": 5, "steps": 500}) + "\n")

    stream = io.StringIO()
    summary = watch(running, 0.5, stream=stream, sleep=sleep, clock=lambda: 2065.0)
    assert naps == [0.5] and summary.state == "completed"
    assert stream.getvalue().count("job demo") == 2


def test_watch_stops_quietly_on_ctrl_c(running):
    def sleep(seconds):
        raise KeyboardInterrupt

    assert watch(running, 1.0, stream=io.StringIO(), sleep=sleep, clock=lambda: 2065.0).epochs == 5


# ---------------------------------------------------------------- report


def test_report_files_and_table(finished):
    path = write_report(finished)
    assert path == finished / "report.md"
    for name in ("loss.png", "time_split.png", "workers.png"):
        image = (finished / name).read_bytes()
        assert len(image) > 1000 and image.startswith(PNG_SIGNATURE), name
    assert not list(finished.glob(".*.tmp"))

    text = path.read_text()
    assert "# shoal report: demo" in text and "**completed**" in text
    for image in ("(loss.png)", "(time_split.png)", "(workers.png)"):
        assert image in text
    assert "host-0, host-1" in text and "torch 2.13.0" in text
    assert "SIGKILL" in text and "restart 1 from epoch 1's checkpoint, epochs redone: 2" in text
    assert "resumed" not in text  # the restart's own job_resumed is not a second incident
    assert "1 epoch(s) trained twice: 9.00 s lost" in text

    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| epoch |"))
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    assert columns == ["epoch", "train loss", "test loss", "test accuracy", "test auc", "samples/s", "compute s",
                       "communication s", "data s", "evaluation s", "epoch s"]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert [row[0] for row in rows] == ["1", "2", "3"]  # the redone epoch 2 appears once: its kept attempt
    for row in rows:
        seconds, train_loss, test = KEPT[int(row[0])]
        assert float(row[1]) == pytest.approx(train_loss)
        assert [float(cell) for cell in row[2:5]] == pytest.approx([test["loss"], test["accuracy"], test["auc"]])
        assert float(row[5].replace(",", "")) == pytest.approx(3200 / seconds, abs=0.5)
        split = [float(cell) for cell in row[6:10]]
        assert split == pytest.approx([seconds * 0.6, seconds * 0.2, seconds * 0.1, seconds * 0.1], abs=0.005)
        assert float(row[10]) == pytest.approx(seconds)
    total = next(line for line in lines if line.startswith("| **total**"))
    assert total.rstrip(" |").endswith(f"{sum(kept[0] for kept in KEPT.values()):.2f}")


def test_report_of_a_running_run(running):
    text = write_report(running).read_text()
    assert "no job_end yet" in text and "None." in text
    assert (running / "workers.png").read_bytes().startswith(PNG_SIGNATURE)


# ---------------------------------------------------------------- command line


def test_cli_status(finished, capsys):
    assert main(["status", str(finished)]) == 0
    out = capsys.readouterr().out
    assert "completed" in out and "epoch 3/3" in out and "<- slowest" in out


def test_cli_status_watch_ends_with_the_job(finished, capsys):
    assert main(["status", str(finished), "--watch", "0.01"]) == 0
    assert capsys.readouterr().out.count("epoch 3/3") == 1


def test_cli_report(finished, capsys):
    assert main(["report", str(finished)]) == 0
    assert capsys.readouterr().out.strip() == str(finished / "report.md")
    assert (finished / "report.md").exists()


@pytest.mark.parametrize("command", ["status", "report"])
def test_cli_not_a_run_directory(tmp_path, capsys, command):
    assert main([command, str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"shoal: error: {tmp_path}: no events.jsonl: not a shoal run directory\n"
