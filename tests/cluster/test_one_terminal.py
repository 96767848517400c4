"""`shoal train --hosts` from one terminal on the emulated cluster: the head (outside every host) reaches
each host through the cluster's stand-in for ssh, the hosts train one job together with their output
prefixed by name, Ctrl-C to the head leaves nothing running on either host, and a host that cannot be
reached is one line naming it; a scaling study runs its trials on the first N hosts."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from shoal.bench.study import read_trials
from shoal.events import read_events
from tests.cluster.jobs import write_job, write_sabotaged_job


def head(cluster, job: str, run_dir, hosts: str, env) -> subprocess.Popen:
    remote = f"{cluster.enter} {{host}}"
    return subprocess.Popen([sys.executable, "-m", "shoal", "train", job, "--hosts", hosts, "--run-dir", str(run_dir),
                             "--set", f"cluster.remote='{remote}'"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_hosts_train_together_and_ctrl_c_stops_every_host(two_hosts, project_env):
    job = write_sabotaged_job(two_hosts.shared, "hosts", delay=0.02, epochs=50)
    run_dir = two_hosts.shared / "run-hosts"
    process = head(two_hosts, job, run_dir, "host0:1,host1:1", project_env)
    try:
        deadline = time.monotonic() + 90
        while not any(event["event"] == "epoch_end" for event in read_events(run_dir)):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no epoch ended within 90 s"
            time.sleep(0.2)
        start = next(event for event in read_events(run_dir) if event["event"] == "job_start")
        assert start["hosts"] == ["host0", "host1"]
        process.send_signal(signal.SIGINT)
        output, errors = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, errors
    assert "[host0] epoch 1/50" in output and "[host1]" in output
    assert f"continue with: shoal train --resume {run_dir} --hosts host0,host1" in errors
    for host in range(2):
        assert not two_hosts.pids(host), f"host{host} still runs {two_hosts.pids(host)}"
    assert [event["status"] for event in read_events(run_dir) if event["event"] == "job_end"] == ["interrupted"]


def test_a_host_that_cannot_be_reached_is_named(two_hosts, project_env):
    job = write_sabotaged_job(two_hosts.shared, "unreachable")
    process = head(two_hosts, job, two_hosts.shared / "run-unreachable", "host0:1,nowhere:1", project_env)
    _, errors = process.communicate(timeout=60)
    assert process.returncode == 2
    assert errors.strip().splitlines()[-1].startswith("shoal: error: nowhere: could not be reached"), errors
    assert not two_hosts.pids(0)


def test_a_scaling_study_across_hosts(two_hosts, project_env):
    job = write_job(two_hosts.shared, "averaging")
    out = two_hosts.shared / "study"
    remote = f"{two_hosts.enter} {{host}}"
    finished = subprocess.run([sys.executable, "-m", "shoal", "bench", "scaling", job, "--sizes", "600",
                               "--workers", "1", "--hosts", "host0,host1", "--trials", "1", "--out", str(out),
                               "--set", f"cluster.remote='{remote}'", "--no-progress"], capture_output=True,
                              text=True, env=project_env, timeout=180)
    assert finished.returncode == 0, finished.stderr[-3000:]
    rows = read_trials(out)
    assert sorted((row["size"], row["nodes"], row["workers"], row["hosts"]) for row in rows) == [
        ("600", 1, 1, "host0"), ("600", 2, 2, "host0 host1")]
    assert all(row["train_seconds"] > 0 for row in rows)
    for name in ("report.md", "anova.csv", "tukey.csv", "time_by_workers.png", "speedup.png"):
        assert (out / name).stat().st_size > 0, name
    assert "Across machines: host0, host1" in (out / "report.md").read_text()
