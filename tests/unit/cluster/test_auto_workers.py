"""`--workers auto` across machines: each machine answers for itself, also when started by hand (what a `--hosts`
head asks every host: tests/processes/cluster/test_remote.py)."""

from __future__ import annotations

from shoal.api import resolve_job
from shoal.cli import workers_for
from shoal.train.capacity import auto_workers

JOB = {"model": {"layers": [{"dense": 2}]}, "data": {"train": "train"}, "cluster": {"memory_per_worker": "1MiB"}}


def test_auto_on_a_machine_started_by_hand_among_several_is_its_own_answer(capsys):
    job = resolve_job(JOB)
    assert workers_for("auto", job, 3) == auto_workers(job, 3)[0]
    told = capsys.readouterr().err.strip()
    assert told.startswith("shoal: --workers auto: ")
    assert told.endswith("its share of the data assumes the other 2 machine(s) run as many")


def test_auto_alone_says_nothing_of_other_machines(capsys):
    workers_for("auto", resolve_job(JOB), 1)
    assert "other" not in capsys.readouterr().err
