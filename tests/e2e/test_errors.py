"""Bad input: a one-line message naming the culprit, exit status 2, nothing written."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from shoal.cli import main
from shoal.cluster.store import SECRET_VARIABLE
from tests.e2e.jobs import write_job, write_task


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("task"), rows=200, test_rows=50)


CASES = {
    "unknown algorithm": ([], ["--set", "algorithm.name=downhill"], "algorithm.name: unknown algorithm 'downhill'"),
    "unknown key": (["epoch = 3"], [], "train.epoch: unknown key (did you mean 'train.epochs'?)"),
    "missing dataset": ([], ["--set", "data.train='nowhere/train'"], "nowhere/train: dataset not found"),
    "input size": ([], ["--set", "model.input=[100]"], "model.input: [100] holds 100 values, but data.train"),
    "no workers": ([], ["--workers", "0"], "--workers: must be an integer >= 1, got 0"),
    "bad optimizer argument": ([], ["--set", "train.optimizer.momentum_typo=0.9"], "train.optimizer.momentum_typo"),
    "bad period": ([], ["--set", "algorithm.period=0"], "algorithm.period: must be"),
    "no algorithm with workers": ([], ["--set", "algorithm.name='none'", "--workers", "2"],
                                  "algorithm.name: 'none' trains without communication"),
    "node rank": ([], ["--nnodes", "2", "--node-rank", "2"], "--node-rank: must be in 0..1, got 2"),
    "a server without trainers": ([], ["--set", "algorithm.name='downpour'", "--workers", "1"],
                                  "cluster.workers: this algorithm needs a server and at least 1 trainer(s)"),
    "groups without a hierarchy": ([], ["--set", "algorithm.name='sync'", "--set", "cluster.groups=2",
                                        "--workers", "2"], "cluster.groups: 'sync' has no groups"),
    "bad memory size": ([], ["--set", "data.memory_per_worker='lots'"], "data.memory_per_worker: must be a size"),
    "memory budget too small": ([], ["--set", "data.memory_per_worker=1000"],
                                "data.memory_per_worker: 1,000 bytes cannot hold"),
    # found only in the workers once, as tracebacks that --max-restarts retried
    "optimizer lbfgs": ([], ["--set", "train.optimizer.name='lbfgs'"],
                        "train.optimizer.name: 'lbfgs' cannot be used: LBFGS needs a closure"),
    "optimizer sparseadam": ([], ["--set", "train.optimizer.name='sparseadam'"],
                             "train.optimizer.name: 'sparseadam' cannot be used"),
    "huge timeout": ([], ["--set", "cluster.timeout=1e15"], "cluster.timeout: must be seconds from 1 to 604800"),
    "tiny timeout": ([], ["--set", "cluster.timeout=0.0001"], "cluster.timeout: must be seconds from 1 to 604800"),
    "huge seed": (["seed = 18446744073709551615"], [],
                  "train.seed: must be an integer from 0 to 9223372036854775807, got 18446744073709551615"),
    "too many threads": ([], ["--set", "cluster.threads=100000000"],
                         "cluster.threads: must be an integer from 0 to 1024, got 100000000"),
    "threads not an integer": ([], ["--set", "cluster.threads=1e8"], "cluster.threads: expected int, got 100000000.0"),
    # a traceback in the launcher once (an allocation of 2.3 trillion parameters)
    "model too large": ([], ["--set", "model.layers=[{dense = 100000000000}, {dense = 2}]"],
                        "model.layers: the model has 2,300,000,000,002 parameters"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_naming_the_culprit(case, task, tmp_path, capsys):
    lines, arguments, expected = CASES[case]
    train, test = task
    job = write_job(tmp_path / "job.toml", train, test)
    if lines:  # extra keys go into the [train] table
        job.write_text(job.read_text().replace("[train]\n", "[train]\n" + "\n".join(lines) + "\n"))
    run_dir = tmp_path / "run"
    status = main(["train", str(job), "--run-dir", str(run_dir), *arguments])
    error = capsys.readouterr().err.strip()
    assert status == 2
    assert len(error.splitlines()) == 1, error
    assert expected in error
    assert not run_dir.exists()


def test_many_machines_need_one_run_directory_path(task, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train, test = task
    job = write_job(tmp_path / "job.toml", train, test)
    status = main(["train", str(job), "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29400", "--insecure"])
    assert status == 2
    assert capsys.readouterr().err.strip() == (
        "shoal: error: --run-dir: required with --nnodes > 1 (the same path on every machine)")
    assert not (tmp_path / "runs").exists()


def test_machines_started_by_hand_without_a_secret_are_refused_before_anything_is_written(task, tmp_path, capsys,
                                                                                         monkeypatch):
    monkeypatch.delenv("SHOAL_JOB_SECRET", raising=False)
    train, test = task
    job = write_job(tmp_path / "job.toml", train, test)
    status = main(["train", str(job), "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29400", "--run-dir",
                   str(tmp_path / "run")])
    assert status == 2
    assert capsys.readouterr().err.strip() == (
        "shoal: error: --rdzv-endpoint 127.0.0.1:29400: a job of several machines needs a secret that every machine "
        "holds: make one (openssl rand -hex 16 > FILE; chmod 600 FILE) and give each machine --secret-file FILE (or "
        "SHOAL_JOB_SECRET in its environment), or say --insecure on a network where nobody else can reach the job's "
        "ports")
    assert not (tmp_path / "run").exists()


def test_exit_status_and_message_from_the_command(task, tmp_path, project_env):
    train, test = task
    job = write_job(tmp_path / "job.toml", train, test)
    finished = subprocess.run([sys.executable, "-m", "shoal", "train", str(job), "--workers", "0"],
                              capture_output=True, text=True, env=project_env, timeout=60)
    assert finished.returncode == 2
    assert finished.stderr.strip() == "shoal: error: --workers: must be an integer >= 1, got 0"
    assert "Traceback" not in finished.stderr


HOST = socket.gethostname()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.timeout(120)
def test_a_layout_of_different_worker_counts_the_job_cannot_use_stops_every_node_in_one_line(task, tmp_path,
                                                                                              project_env):
    """Machines may run different counts: 2 + 1 workers are 3 in all, too few for 4 groups. Every node is told so
    once all have met, in one line naming each machine's count (node 1 alone would count 2 x 1 = 2, node 0
    2 x 2 = 4 and wait for the other until cluster.timeout)."""
    train, test = task
    job = write_job(tmp_path / "job.toml", train, test, epochs=1)
    endpoint = f"127.0.0.1:{free_port()}"
    settings = ["--set", "cluster.groups=4", "--set", "algorithm.group_period=1", "--set", "cluster.timeout=60"]
    nodes = [subprocess.Popen([sys.executable, "-m", "shoal", "train", str(job), "--workers", str(workers),
                               "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint,
                               "--rdzv-id", "e2e-worker-counts", "--run-dir", str(tmp_path / "run"), *settings],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=project_env)
             for rank, workers in ((0, 2), (1, 1))]
    try:
        finished = [node.communicate(timeout=45) for node in nodes]  # within cluster.timeout: nobody waited
    finally:
        for node in nodes:
            node.kill()
    for node, (_, err) in zip(nodes, finished):
        assert node.returncode == 2, err
        assert err.strip().splitlines() == ["shoal: error: cluster.groups: 4 groups need at least 4 training workers, "
                                            f"got 3 (workers on each machine: node 0 ({HOST}) 2, node 1 ({HOST}) 1)"]


@pytest.mark.timeout(120)
def test_the_jobs_secret_is_on_no_command_line(task, tmp_path, project_env):
    """The workers get the secret their store's keys are named by in their environment: `ps` shows argv."""
    train, test = task
    job = write_job(tmp_path / "job.toml", train, test, epochs=30)
    launcher = psutil.Popen([sys.executable, "-m", "shoal", "train", str(job), "--workers", "2", "--run-dir",
                             str(tmp_path / "run")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=project_env)
    try:
        secrets, lines = set(), []
        deadline = time.monotonic() + 60
        while len(secrets) == 0 or len(lines) < 4:  # the launcher, the fork server, 2 stand-ins or workers
            assert launcher.poll() is None and time.monotonic() < deadline, "no workers in time"
            lines, secrets = [], set()
            for process in [launcher, *launcher.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    lines.append(" ".join(process.cmdline()))
                    secrets.add(process.environ().get(SECRET_VARIABLE))
            secrets.discard(None)
            time.sleep(0.2)
        assert len(secrets) == 1
        secret = secrets.pop()
        assert len(secret) == 32 and not [line for line in lines if secret in line]
    finally:
        children = launcher.children(recursive=True)
        launcher.send_signal(signal.SIGINT)
        with contextlib.suppress(psutil.TimeoutExpired):
            launcher.wait(30)
        for process in [*children, launcher]:
            with contextlib.suppress(psutil.Error):
                process.kill()
