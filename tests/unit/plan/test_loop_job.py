"""The planner's timed loop runs the job's own step and transform, without what needs a test set."""

from __future__ import annotations

from pathlib import Path

from shoal.jobs import from_dict
from shoal.plan.compute_probe import loop_job
from shoal.train.prepare import prepare
from tests.e2e.jobs import write_task


def test_the_loop_job_of_a_job_with_metrics_a_stop_rule_and_a_split_prepares(tmp_path: Path):
    train, test = write_task(tmp_path, rows=200, test_rows=20)
    job = from_dict({"model": {"layers": [{"dense": 2}]}, "data": {"train": str(train), "test": str(test),
                                                                   "transform": "tests.support.own_code:jitter"},
                     "train": {"step": "tests.support.own_code:step", "validation_split": 0.2,
                               "metrics": {"positives": "tests.support.own_code:positives"},
                               "stop": {"metric": "test_positives", "above": 0.9}}}, name="job")
    prepare(job)  # the job itself is sound
    loop = from_dict(loop_job(job, train, threads=1), name="loop")
    prepared = prepare(loop)
    assert loop.train.metrics is None and loop.train.stop is None and loop.data.test is None
    assert prepared.step is not None and prepared.transform is not None and prepared.train_set.rows == 200
