"""A stranger on the network against a running job of two machines (`--nnodes 1:2`, two nodes on this machine).

The stranger has what anyone who reaches the job's store port has: it lists every key and reads, sets and
deletes any value (a real TCPStore client), but does not hold the job's secret. While the job runs it reads
every value over and over, the workers' store's too (gloo's addresses, beats): none shows the secret. Then
it does its worst where the job would act: it writes its own text as the job's `end` (in plain, sealed with
a wrong secret, and as a value of the job's own moved there); the test computes that key's name with the
secret, which the stranger cannot, so this is more than a stranger can do. A third launcher with a wrong
secret, and one with none, are refused in one line. The job goes on and completes, the stranger's text
shows nowhere, and the secret is in no file the job wrote and no line it printed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from shoal.cluster import keys
from shoal.cluster.node.greeting import greet
from shoal.cluster.store import Sealed, secret_name
from shoal.events import read_events
from tests.e2e.jobs import write_task
from tests.e2e.test_leave import JOB, free_port, listening, together, wait_until

SECONDS = 90
SECRET = "5f0c2a9e41d87b36e0f19c2d4a7b8e61"
STRANGER_TEXT = "maintenance: stopped by the operator"


def node(job, endpoint: str, run_dir, env, *arguments: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shoal", "train", str(job), "--workers", "1", "--nnodes", "1:2",
                             "--rdzv-endpoint", endpoint, "--run-dir", str(run_dir), *arguments],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def read_everything(stranger: dist.TCPStore) -> dict[str, bytes]:
    """What the stranger learns: every key and its value."""
    values = {}
    for key in stranger.list_keys():
        try:
            values[key] = stranger.get(key)
        except RuntimeError:  # deleted meanwhile
            pass
    return values


def workers_store(stranger: dist.TCPStore) -> dist.TCPStore:
    """The running attempt's store, where the workers beat and gloo's addresses are (found with the secret here;
    a stranger would scan the first machine's ports)."""
    # a deadline only against a hang (the test's timeout comes first): the leader answers within a poll
    instance = greet(Sealed(stranger, SECRET), time.monotonic() + 3600, "the first machine")
    job = Sealed(stranger, SECRET, instance)
    port = int(job.get(keys.attempt(int(job.get(keys.CURRENT)), "port")))
    return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=10))


def attack(stranger: dist.TCPStore) -> None:
    """The stranger's text where the job reads its end: plain, sealed by another secret, and a value of the job's
    own moved there."""
    end = secret_name(SECRET, keys.END)
    stranger.set(end, STRANGER_TEXT)
    time.sleep(1.5)  # every launcher polls for the end at least once a second
    stranger.set(end, Sealed(None, "a" * 32).seal.seal(keys.END, STRANGER_TEXT))
    time.sleep(1.5)
    stranger.set(end, stranger.get(secret_name(SECRET, keys.node(0, "host"))))
    time.sleep(1.5)


@pytest.mark.timeout(2 * SECONDS)
def test_a_stranger_on_the_store_can_neither_learn_the_secret_nor_end_join_or_steer_the_job(tmp_path, project_env):
    train, test = write_task(tmp_path / "task", rows=6000, test_rows=500)
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(train=train, test=test, epochs=40))
    port = free_port()
    endpoint, run_dir = f"127.0.0.1:{port}", tmp_path / "run"
    environment = {**project_env, "SHOAL_JOB_SECRET": SECRET}
    first = node(job, endpoint, run_dir, environment, "--node-rank", "0")
    started = [first]
    try:
        wait_until(lambda: listening(port))
        started.append(node(job, endpoint, tmp_path / "second", environment))
        stranger = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                                 timeout=timedelta(seconds=10))
        seen = read_everything(stranger)
        while not together(run_dir):
            assert first.poll() is None, first.communicate()
            seen.update(read_everything(stranger))
            time.sleep(0.2)
        seen.update(read_everything(stranger))
        seen.update({f"workers' {key}": value for key, value in read_everything(workers_store(stranger)).items()})
        attack(stranger)
        wrong = node(job, endpoint, tmp_path / "wrong", {**project_env, "SHOAL_JOB_SECRET": "b" * 32})
        started.append(wrong)
        _, wrong_error = wrong.communicate(timeout=SECONDS)
        none = node(job, endpoint, tmp_path / "none", project_env)
        started.append(none)
        _, none_error = none.communicate(timeout=SECONDS)
        outputs = [process.communicate(timeout=SECONDS) for process in started[:2]]
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert len(seen) > 10 and not any(SECRET.encode() in key.encode() + value for key, value in seen.items())
    assert [process.returncode for process in started] == [0, 0, 2, 2], outputs
    assert "holds a shoal job with another secret" in wrong_error and wrong_error.count("\n") == 1, wrong_error
    assert "needs a secret that every machine holds" in none_error and none_error.count("\n") == 1, none_error
    assert "that the job's secret did not make: ignored" in outputs[0][1]
    events = list(read_events(run_dir))
    assert [event["status"] for event in events if event["event"] == "job_end"] == ["completed"]
    assert max(len(event["hosts"]) for event in events if event["event"] == "membership") == 2
    assert STRANGER_TEXT not in (run_dir / "events.jsonl").read_text() + "".join(out + err for out, err in outputs)
    written = [path.read_bytes() for folder in (run_dir, tmp_path / "second") for path in folder.rglob("*")
               if path.is_file()]
    assert written and not any(SECRET.encode() in content for content in written)  # nor in any file shoal wrote
    assert not any(SECRET in out + err for out, err in outputs)
