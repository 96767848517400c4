"""Surviving failures: restarts, resume, damaged checkpoints, stalled workers, NaN losses, interrupts."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch

from shoal.cluster import scratch
from shoal.events import read_events
from shoal.train.checkpoint import find_latest
from shoal.train.exits import WITHOUT_A_WORD
from tests.distributed.harness import free_port
from tests.e2e.jobs import write_job as write_task_job
from tests.e2e.jobs import write_task
from tests.support import deadlock

TIMEOUT = 240
EPOCHS = 4
STEPS_PER_EPOCH = 47  # 6000 rows, 2 workers, batch 64


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("task"))


def write_job(path: Path, task, *, action: str = "none", at: int = 0, marker: Path | None = None,
              delay: float = 0.0, extra: str = "", algorithm: str = "averaging", options: str = "") -> Path:
    """A job whose model misbehaves on cue (tests.support.models:sabotaged)."""
    model = (f'factory = "tests.support.models:sabotaged"\n'
             f'arguments = {{ action = "{action}", at = {at}, marker = "{marker or ""}", delay = {delay} }}')
    return write_task_job(path, *task, extra=extra, algorithm=algorithm, model=model, epochs=EPOCHS, options=options)


def shoal(*arguments, env, timeout=TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, arguments)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "model.pt", weights_only=True)["state_dict"]


def assert_same_weights(run_dir: Path, reference: dict) -> None:
    got = weights(run_dir)
    assert got.keys() == reference.keys()
    assert all(torch.equal(got[key], reference[key]) for key in got), "weights differ from the uninterrupted run"


def events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in read_events(run_dir) if e["event"] == kind]


def processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if text in " ".join(process.info["cmdline"] or []):
                found.append(process)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def uninterrupted(task, tmp_path_factory, project_env_module):
    """The final weights of the job run from start to end without trouble."""
    folder = tmp_path_factory.mktemp("reference")
    job = write_job(folder / "job.toml", task)
    finished = shoal("train", job, "--workers", 2, "--run-dir", folder / "run", env=project_env_module)
    assert finished.returncode == 0, finished.stderr
    return folder / "run", weights(folder / "run")


def test_killed_worker_is_restarted_from_the_checkpoint(task, uninterrupted, tmp_path, project_env):
    job = write_job(tmp_path / "job.toml", task, action="kill", at=STEPS_PER_EPOCH + 20, marker=tmp_path / "fired")
    run_dir = tmp_path / "run"
    finished = shoal("train", job, "--workers", 2, "--run-dir", run_dir, "--max-restarts", 1, env=project_env)
    assert finished.returncode == 0, finished.stderr
    assert (tmp_path / "fired").exists()
    failed = events(run_dir, "worker_failed")
    assert len(failed) == 1 and failed[0]["rank"] == 1 and failed[0]["signal"] == "SIGKILL", failed
    restarted = events(run_dir, "job_restarted")
    assert restarted == [{**restarted[0], "restart": 1, "from_epoch": 1, "epochs_redone": 1}]
    assert events(run_dir, "job_end")[-1]["status"] == "completed"
    assert_same_weights(run_dir, uninterrupted[1])

    report = shoal("report", run_dir, env=project_env)
    assert report.returncode == 0, report.stderr
    for name in ("report.md", "loss.png", "time_split.png", "workers.png"):
        assert (run_dir / name).stat().st_size > 0
    assert "restart" in (run_dir / "report.md").read_text().lower()


def test_a_worker_restarted_by_torchruns_own_agent_continues_from_the_checkpoint(task, uninterrupted, tmp_path,
                                                                                 project_env):
    job = write_job(tmp_path / "job.toml", task, action="kill", at=STEPS_PER_EPOCH + 20, marker=tmp_path / "fired")
    run_dir = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "--max-restarts", "1", "--log-dir", str(tmp_path / "logs"),  # else a /tmp/torchelastic_* stays
                "-m", "shoal.worker", str(job), "--run-dir", str(run_dir)]
    finished = subprocess.run(torchrun, capture_output=True, text=True, env=project_env, timeout=TIMEOUT)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert (tmp_path / "fired").exists()
    assert [event["from_epoch"] for event in events(run_dir, "job_resumed")] == [1]
    assert_same_weights(run_dir, uninterrupted[1])
    # torchrun's agent restarts the workers, so the workers record the failure themselves
    failed = events(run_dir, "worker_failed")
    assert [(event["rank"], event["message"]) for event in failed] == [(1, WITHOUT_A_WORD)], failed
    assert [event["restart"] for event in events(run_dir, "job_restarted")] == [1]
    assert events(run_dir, "job_end")[-1]["status"] == "completed"


@pytest.mark.parametrize("compression", ["none", "powersgd"])
def test_killed_worker_with_sync_matches_too(task, tmp_path, project_env, compression):
    """With PowerSGD the restart also needs each rank's error feedback and Q from its checkpoint."""
    options = f'compression = "{compression}"\ncompression_rank = 2'
    reference = write_job(tmp_path / "reference.toml", task, algorithm="sync", options=options)
    finished = shoal("train", reference, "--workers", 2, "--run-dir", tmp_path / "reference", env=project_env)
    assert finished.returncode == 0, finished.stderr
    job = write_job(tmp_path / "job.toml", task, action="kill", at=2 * STEPS_PER_EPOCH + 5,
                    marker=tmp_path / "fired", algorithm="sync", options=options)
    run_dir = tmp_path / "run"
    finished = shoal("train", job, "--workers", 2, "--run-dir", run_dir, "--max-restarts", 1, env=project_env)
    assert finished.returncode == 0, finished.stderr
    assert events(run_dir, "job_restarted")[0]["from_epoch"] == 2
    assert_same_weights(run_dir, weights(tmp_path / "reference"))


def test_interrupt_then_resume_gives_the_uninterrupted_weights(task, uninterrupted, tmp_path, project_env):
    job = write_job(tmp_path / "job.toml", task, delay=0.05)  # about 2.5 s per epoch
    run_dir = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-m", "shoal", "train", str(job), "--workers", "2",
                                "--run-dir", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=project_env)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not any(e["epoch"] >= 2 for e in events(run_dir, "epoch_end")):
            assert process.poll() is None and time.monotonic() < deadline, "the job ended before epoch 2"
            time.sleep(0.05)
        status = shoal("status", run_dir, env=project_env)  # a running job's status
        assert status.returncode == 0, status.stderr
        assert "running" in status.stdout and "epoch" in status.stdout
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)  # a hang guard: the workers stop within a second or two
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert f"continue with: shoal train --resume {run_dir}" in stderr
    assert events(run_dir, "job_end")[-1]["status"] == "interrupted"
    assert not processes_mentioning(str(run_dir)), "a worker outlived the interrupt"
    assert not list((run_dir / "checkpoints").glob(".*")), "a half-written checkpoint was left"
    assert not (run_dir / "model.pt").exists()

    finished = shoal("train", "--resume", run_dir, "--trust-code", env=project_env)
    assert finished.returncode == 0, finished.stderr
    assert events(run_dir, "job_resumed")[-1]["from_epoch"] >= 2
    assert_same_weights(run_dir, uninterrupted[1])


def test_workers_end_when_their_launcher_is_killed(task, tmp_path, project_env):
    """SIGKILL leaves the launcher no moment to stop its workers: they must notice and stop themselves."""
    job = write_job(tmp_path / "job.toml", task, delay=0.05)  # about 2.5 s per epoch
    run_dir = tmp_path / "run"
    launch_folders = set(Path(tempfile.gettempdir()).glob("shoal-launch.*"))
    launcher = subprocess.Popen([sys.executable, "-m", "shoal", "train", str(job), "--workers", "2",
                                 "--run-dir", str(run_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=project_env)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not events(run_dir, "epoch_end"):
            assert launcher.poll() is None and time.monotonic() < deadline, "the job ended before epoch 1"
            time.sleep(0.05)
        workers = [p for p in processes_mentioning(str(run_dir)) if p.pid != launcher.pid]
        assert len(workers) == 2
        launcher.kill()
        launcher.wait(timeout=10)
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, "workers outlived their launcher by more than 10 s"
    finally:
        launcher.kill()
        for process in processes_mentioning(str(run_dir)):
            process.kill()
        for folder in set(Path(tempfile.gettempdir()).glob("shoal-launch.*")) - launch_folders:
            if scratch.owner(folder.name) == launcher.pid:  # not another test's, running beside this one
                shutil.rmtree(folder)  # a SIGKILLed launcher cannot remove its own
    assert not (run_dir / "model.pt").exists()


def test_a_truncated_newest_checkpoint_is_skipped(uninterrupted, tmp_path, project_env):
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted[0], run_dir)
    (run_dir / "model.pt").unlink()
    newest = run_dir / "checkpoints" / f"epoch-{EPOCHS:05d}" / "rank-00001.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.warns(UserWarning, match="skipping damaged checkpoint .*rank-00001.pt"):
        found = find_latest(run_dir, world_size=2)
    assert found.epoch == EPOCHS - 1
    finished = shoal("train", "--resume", run_dir, "--trust-code", env=project_env)
    assert finished.returncode == 0, finished.stderr
    assert events(run_dir, "job_resumed")[-1]["from_epoch"] == EPOCHS - 1
    assert_same_weights(run_dir, uninterrupted[1])


def test_a_stopped_worker_fails_the_job_within_the_timeout(task, tmp_path, project_env):
    job = write_job(tmp_path / "job.toml", task, action="stop", at=30, extra="[cluster]\ntimeout = 5")
    run_dir = tmp_path / "run"
    # the 120 s limit is a hang guard; that the 5 s timeout caught it is what "stopped answering" says
    finished = shoal("train", job, "--workers", 2, "--run-dir", run_dir, env=project_env, timeout=120)
    assert finished.returncode == 1, finished.stderr
    last = finished.stderr.strip().splitlines()[-1]
    assert "worker rank 1 on " in last and "stopped answering" in last, last
    assert not processes_mentioning(str(run_dir)), "the stopped worker was left behind"
    assert events(run_dir, "worker_failed")[0]["rank"] == 1
    assert events(run_dir, "job_end")[-1]["status"] == "failed"


STALL = 5  # cluster.stall_timeout, seconds; cluster.timeout stays at its 300


def test_a_hung_worker_is_named_within_the_stall_timeout_and_the_job_restarts(task, uninterrupted, tmp_path,
                                                                              project_env):
    """SIGSTOP leaves a worker alive and silent (its heartbeat thread stops with it), where only the collectives'
    300 s timeout used to end the wait. It is named as not answering well within a minute of the stop (the
    documented time is STALL + about 2 s, then seconds to kill it and end the attempt: the bound is generous),
    the job restarts from its checkpoint and ends with the uninterrupted job's weights; nothing is left behind."""
    job = write_job(tmp_path / "job.toml", task, action="stop", at=STEPS_PER_EPOCH + 20, marker=tmp_path / "fired",
                    extra=f"[cluster]\nstall_timeout = {STALL}")
    run_dir = tmp_path / "run"
    returncode, left = run_watched(["train", job, "--workers", 2, "--run-dir", run_dir, "--max-restarts", 1],
                                   project_env, tmp_path / "stderr")
    said = (tmp_path / "stderr").read_text()
    assert returncode == 0, said[-3000:]
    assert not left, f"left behind: {left}"
    failed = events(run_dir, "worker_failed")
    assert len(failed) == 1 and failed[0]["rank"] == 1 and failed[0].get("signal") is None, failed
    assert "stopped answering at step" in failed[0]["message"], failed
    assert failed[0]["time"] - (tmp_path / "fired").stat().st_mtime < 3 * STALL + 30
    lines = [line for line in said.splitlines() if line.startswith("shoal: worker rank 1 on ")]
    assert len(lines) == 1 and "stopped answering at step" in lines[0] and lines[0].endswith(
        "; the others waited for it; restarting from epoch 1's checkpoint, restart 1 of 1"), said[-3000:]
    assert [event["from_epoch"] for event in events(run_dir, "job_restarted")] == [1]
    assert events(run_dir, "job_end")[-1]["status"] == "completed"
    assert_same_weights(run_dir, uninterrupted[1])


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run_watched(arguments: list, env: dict, stderr: Path) -> tuple[int, list[psutil.Process]]:
    """`python -m shoal *arguments` run to its end with every process it starts watched: its exit status, and those
    of its processes still alive after it ended (killed then: none is left behind either way, nor when the test's
    timeout stops the wait)."""
    with open(stderr, "w") as said:
        launcher = subprocess.Popen([sys.executable, "-m", "shoal", *map(str, arguments)], stdout=subprocess.DEVNULL,
                                    stderr=said, env=env)
    seen: set[psutil.Process] = set()  # forked workers do not name the run directory
    try:
        while launcher.poll() is None:
            with contextlib.suppress(psutil.Error):
                seen.update(psutil.Process(launcher.pid).children(recursive=True))
            time.sleep(0.2)
    finally:
        launcher.kill()
        launcher.wait()
        left = [process for process in seen if alive(process)]
        for process in left:  # a stopped worker cannot act on SIGTERM, nor die before it runs again
            with contextlib.suppress(psutil.Error):
                process.resume()
                process.kill()
    return launcher.returncode, left


def test_a_deadlocked_worker_is_named_within_the_stall_timeout_and_the_job_restarts(task, tmp_path, project_env):
    """Rank 1's own step (tests.support.deadlock) blocks forever in epoch 2, as on a lock, while its heartbeat
    thread beats on: silence never names it, and cluster.timeout (300 s) would. Rank 0 waits for it in sync's
    gradient exchange (on the exchange's own thread); once it has waited STALL seconds and rank 1 has trained at
    one step as long, rank 0 names rank 1 as stopped making progress and leaves, the launcher ends the attempt,
    and the restarted attempt (whose step finds the marker and does not block) completes. The bound on the time
    to name it is generous: the documented time is STALL plus about 2 s, then seconds to end the attempt."""
    job = write_task_job(tmp_path / "job.toml", *task, algorithm="sync", options="overlap = true",
                         extra=f"[cluster]\nstall_timeout = {STALL}")
    job.write_text(job.read_text().replace("[train]\n", f'[train]\nstep = "{deadlock.__name__}:step"\n', 1))
    run_dir, fired = tmp_path / "run", tmp_path / "fired"
    returncode, left = run_watched(["train", job, "--workers", 2, "--run-dir", run_dir, "--max-restarts", 1],
                                   {**project_env, deadlock.MARKER: str(fired)}, tmp_path / "stderr")
    said = (tmp_path / "stderr").read_text()
    assert returncode == 0, said[-3000:]
    assert not left, f"left behind: {left}"
    failed = events(run_dir, "worker_failed")
    assert len(failed) == 1 and failed[0]["rank"] == 1, failed
    assert f"stopped making progress at step {deadlock.AT - 1} (busy outside the exchange for " in failed[0]["message"]
    assert failed[0]["time"] - fired.stat().st_mtime < 3 * STALL + 30
    lines = [line for line in said.splitlines() if line.startswith("shoal: worker rank 1 on ")]
    assert len(lines) == 1 and "stopped making progress at step" in lines[0] and lines[0].endswith(
        "; the others waited for it; restarting from epoch 1's checkpoint, restart 1 of 1"), said[-3000:]
    assert [event["from_epoch"] for event in events(run_dir, "job_restarted")] == [1]
    assert events(run_dir, "job_end")[-1]["status"] == "completed"


def test_a_nan_loss_stops_the_job_naming_epoch_and_step(task, tmp_path, project_env):
    job = write_job(tmp_path / "job.toml", task, action="nan", at=STEPS_PER_EPOCH + 13)
    run_dir = tmp_path / "run"
    finished = shoal("train", job, "--workers", 2, "--run-dir", run_dir, "--max-restarts", 2, env=project_env)
    assert finished.returncode == 2, finished.stderr
    assert "loss is nan at epoch 2, step 13" in finished.stderr.strip().splitlines()[-1]
    assert events(run_dir, "job_restarted") == []  # the same input would fail the same way
    assert (run_dir / "checkpoints" / "epoch-00001" / "coordinator.pt").exists()


def test_resuming_with_another_batch_size_is_refused(uninterrupted, tmp_path, project_env):
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted[0], run_dir)
    finished = shoal("train", "--resume", run_dir, "--trust-code", "--set", "train.batch_size=32", env=project_env)
    assert finished.returncode == 2
    assert "train.batch_size: the checkpoints in" in finished.stderr
    assert "(64, now 32); resume with the same one" in finished.stderr


def slurm_task(rank: int, job: Path, run_dir: Path, env: dict, port: int, requeued: int = 0) -> subprocess.Popen:
    """One task of a 2-task job step on this machine, with the variables srun sets (no MASTER_ADDR: derived)."""
    variables = {**env, "SLURM_JOB_ID": "4242", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
                 "SLURM_NODEID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2",
                 "SLURM_JOB_NODELIST": "localhost", "MASTER_PORT": str(port), "SLURM_RESTART_COUNT": str(requeued),
                 "PATH": os.path.dirname(sys.executable)}  # no scontrol: job 4242 is nobody's to requeue
    return subprocess.Popen([sys.executable, "-m", "shoal.worker", str(job), "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=variables)


def test_slurms_warning_stops_at_an_epochs_end_and_the_requeued_job_continues(task, uninterrupted, tmp_path,
                                                                              project_env):
    job = write_job(tmp_path / "job.toml", task, delay=0.05)  # about 2.5 s per epoch
    run_dir = tmp_path / "run"
    port = free_port()
    tasks = [slurm_task(rank, job, run_dir, project_env, port) for rank in range(2)]
    try:
        deadline = time.monotonic() + TIMEOUT
        while not events(run_dir, "epoch_end"):
            assert all(task.poll() is None for task in tasks) and time.monotonic() < deadline
            time.sleep(0.05)
        for task in tasks:  # as `sbatch --signal=USR1@120` does before the time limit
            task.send_signal(signal.SIGUSR1)
        outputs = [task.communicate(timeout=30) for task in tasks]
    finally:
        for task in tasks:
            task.kill()
    assert [task.returncode for task in tasks] == [75, 75], [output[1][-2000:] for output in outputs]
    end = events(run_dir, "job_end")
    assert [event["status"] for event in end] == ["interrupted"] and "requeue" in end[0]["message"]
    stopped_at = len(events(run_dir, "epoch_end"))
    assert stopped_at < EPOCHS and find_latest(run_dir, 2).epoch == stopped_at  # the checkpoint of that epoch

    port = free_port()
    tasks = [slurm_task(rank, job, run_dir, project_env, port, requeued=1) for rank in range(2)]
    outputs = [task.communicate(timeout=TIMEOUT) for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], outputs[0][1][-2000:]
    assert [event["from_epoch"] for event in events(run_dir, "job_resumed")] == [stopped_at]
    assert_same_weights(run_dir, uninterrupted[1])


def test_a_killed_worker_is_named_in_one_line_and_the_others_stop_without_tracebacks(task, tmp_path, project_env):
    job = write_job(tmp_path / "job.toml", task, action="kill", at=STEPS_PER_EPOCH + 20, marker=tmp_path / "fired")
    finished = shoal("train", job, "--workers", 2, "--run-dir", tmp_path / "run", "--max-restarts", 1,
                     env=project_env)
    assert finished.returncode == 0, finished.stderr
    lines = finished.stderr.splitlines()
    said = [line for line in lines if line.startswith("shoal: worker rank 1 on ")]
    assert len(said) == 1 and said[0].endswith(
        "failed: killed by SIGKILL; restarting from epoch 1's checkpoint, restart 1 of 1"), finished.stderr
    # rank 0 says at most one line, when it notices the loss before its launcher stops it
    assert len([line for line in lines if line.startswith("shoal worker 0:")]) <= 1, finished.stderr
    noise = [line for line in lines if "Traceback" in line or "pair.cc" in line]
    assert len(noise) < 10, finished.stderr
