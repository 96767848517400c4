"""A trainer 5x slower than the others: asynchronous Downpour lets the others run on, synchronous Downpour does not.

The speed claim tests/e2e/test_stragglers.py once asserted and now leaves to a benchmark (its test checks the order
of steps, which load cannot change). A parameter server and 3 trainers on this machine (4 processes); the slow
trainer (rank 2) sleeps in every training forward pass, long enough to take 5x its step time measured first in
the same run without the sleep. Each trainer's step rate is its median steps per second over the epochs after the
first (epoch_end). Goals: the straggler is slowed to at most a third of its own pace; asynchronous Downpour's other
trainers keep at least half their unslowed pace (as a group: 4 processes on 2 cores move one trainer's rate by up
to a third between runs); synchronous Downpour's fall to at most half of theirs. Results go to
benchmarks/results/*-stragglers.md and .json.

    .venv/bin/python -m benchmarks.stragglers        # about 2 minutes on 2 cores
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import torch
from tests.e2e.jobs import FEATURES, write_job, write_task
from torch import nn

from benchmarks.common import ROOT, WORK, machine, machine_line, write_result
from shoal.events import read_history

SLOW_RANK = 2


class Straggler(nn.Module):
    """A small MLP that sleeps `delay` seconds in every training forward pass on worker `rank`."""

    def __init__(self, features: int, rank: int, delay: float):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(features, 32), nn.Tanh(), nn.Linear(32, 2))
        self.slow = os.environ.get("RANK") == str(rank) and delay > 0
        self.delay = delay

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training and self.slow:
            time.sleep(self.delay)
        return self.inner(inputs)


def straggling(features: int = FEATURES, rank: int = SLOW_RANK, delay: float = 0.0) -> nn.Module:
    """The job's model factory."""
    return Straggler(features, rank, delay)


def step_rates(job, run_dir, synchronous: bool, delay: float) -> dict[int, float]:
    """Median steps per second of each trainer over the epochs after the first."""
    finished = subprocess.run(
        [sys.executable, "-m", "shoal", "train", str(job), "--workers", "4", "--run-dir", str(run_dir),
         "--set", f"algorithm.synchronous={str(synchronous).lower()}", "--set", "output.progress='none'",
         "--set", f"model.arguments={{ features = {FEATURES}, rank = {SLOW_RANK}, delay = {delay} }}"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    if finished.returncode != 0:
        sys.exit(f"benchmarks.stragglers: {run_dir.name}: {finished.stderr.strip().splitlines()[-1]}")
    epochs = read_history(run_dir).epochs[1:]
    ranks = [worker.rank for worker in epochs[0].workers]
    return {rank: statistics.median(worker.steps_per_second for epoch in epochs for worker in epoch.workers
                                    if worker.rank == rank) for rank in ranks}


def report(plain: dict, slowed: dict, sync_slowed: dict, delay: float, minutes: float) -> tuple[str, dict]:
    fast = [rank for rank in plain if rank != SLOW_RANK]
    straggler = slowed[SLOW_RANK] / plain[SLOW_RANK]
    kept = statistics.mean(slowed[rank] for rank in fast) / statistics.mean(plain[rank] for rank in fast)
    held = max(sync_slowed[rank] / plain[rank] for rank in fast)
    goals = [("the straggler at most a third of its own pace", straggler, straggler <= 1 / 3),
             ("asynchronous: the others keep at least half their pace", kept, kept >= 0.5),
             ("synchronous: the others fall to at most half theirs", held, held <= 0.5)]
    rows = "\n".join(f"| {rank}{' (slowed)' if rank == SLOW_RANK else ''} | {plain[rank]:.1f} | {slowed[rank]:.1f} | "
                     f"{sync_slowed[rank]:.1f} |" for rank in plain)
    lines = "\n".join(f"- {text}: {value:.2f}x: {'met' if met else '**missed**'}" for text, value, met in goals)
    markdown = f"""# A straggler: asynchronous Downpour runs on, synchronous waits

{machine_line()}. Downpour, a server and 3 trainers on this machine, 6,000 rows of a two-class task, 2 epochs;
rank {SLOW_RANK} sleeps {1000 * delay:.1f} ms in every training step (4 of its step times). Steps per second, the median
over the epochs after the first. `python -m benchmarks.stragglers` ({minutes:.1f} minutes).

| trainer | asynchronous, unslowed | asynchronous, slowed | synchronous, slowed |
| --- | ---: | ---: | ---: |
{rows}

{lines}
"""
    return markdown, {"plain": plain, "slowed": slowed, "sync_slowed": sync_slowed, "delay": delay,
                      "goals": [{"goal": text, "ratio": value, "met": met} for text, value, met in goals]}


def main() -> int:
    began = time.monotonic()
    folder = WORK / "stragglers"
    subprocess.run(["rm", "-rf", str(folder)], check=True)
    train, test = write_task(folder / "task", rows=6000, test_rows=200)
    job = write_job(folder / "job.toml", train, test, algorithm="downpour", epochs=2,
                    model='factory = "benchmarks.stragglers:straggling"', extra="[checkpoint]\nevery = 0")
    plain = step_rates(job, folder / "async-plain", False, 0.0)
    delay = 4.0 / plain[SLOW_RANK]  # four more step times asleep: 5x the step time
    slowed = step_rates(job, folder / "async-slowed", False, delay)
    sync_slowed = step_rates(job, folder / "sync-slowed", True, delay)
    markdown, data = report(plain, slowed, sync_slowed, delay, (time.monotonic() - began) / 60)
    print(markdown)
    print(f"written: {write_result('stragglers', markdown, {'machine': machine(), **data})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
