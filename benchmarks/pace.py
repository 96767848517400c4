"""A host's pace at one moment: the calibration's own probed step, timed on request.

`benchmarks.plan` compares predictions made from calibrations minutes old with runs on a VM whose
cores change speed for spells of tens of seconds. Timing the step the calibration timed, right
before and after each run, tells how fast the host was while the run trained. A miss can then be
laid to the model or to the machine. One process per host, started once: it reads a job file and
a batch size per line and answers each with seconds per step, keeping each job's model and data
between requests so that a timing costs no start-up.

    python -m benchmarks.pace        # then lines of `JOB.toml BATCH` on its input
"""

from __future__ import annotations

import functools
import json
import statistics
import sys

from shoal.jobs import load_job
from shoal.plan.compute_probe import ComputeProbe, timed

PACE_SECONDS = 0.4  # of steps per timing, after warm-up: the pace holds for seconds, a step is 0.1-30 ms


class PaceTimer:
    """The probed step of each job's model, one probe (its model and rows) kept per model and training set."""

    def __init__(self):
        self.probes: dict[str, ComputeProbe] = {}

    def step(self, job_path: str, batch: int) -> float:
        return statistics.mean(timed(self.probe(job_path).step_work(batch), seconds=PACE_SECONDS))

    def probe(self, job_path: str) -> ComputeProbe:
        job = load_job(job_path)
        key = json.dumps([job.data.train, job.to_dict()["model"]], sort_keys=True, default=str)
        if key not in self.probes:
            self.probes[key] = ComputeProbe(job, threads=1)
        return self.probes[key]

    def close(self) -> None:
        for probe in self.probes.values():
            probe.loader.close()


def serve(lines, answer) -> None:
    """Answer each `JOB BATCH` line of `lines` with a JSON line {"step": seconds} through `answer`."""
    timer = PaceTimer()
    try:
        for line in lines:
            job_path, batch = line.rsplit(maxsplit=1)
            answer(json.dumps({"step": timer.step(job_path, int(batch))}))
    finally:
        timer.close()


def main() -> None:
    serve((line for line in sys.stdin if line.strip()), functools.partial(print, flush=True))


if __name__ == "__main__":
    main()
