"""`shoal plan` on the step-cost benchmark's own jobs, and whether what it recommends is what the runs measured.

The issue's goal: for every model, the algorithm the plan recommends is at least 1.6x faster on the 2
hosts than one host on the same rows, or the plan says one host and that is measured to be right (no
algorithm measured shoal.plan.planner.WORTH_MORE_MACHINES faster, from which it recommends more machines). The plan
runs on host0 against the sync job of the model (both hosts' rows), measuring host0's compute and the
link to host1 as a user's `shoal plan --hosts` does, for the four algorithms the benchmark runs; its
2-host prediction of each algorithm's step is kept beside the measured one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tests.cluster.hosts import EmulatedCluster

from benchmarks import comm
from shoal.plan.planner import WORTH_MORE_MACHINES

PLAN_SECONDS = 600


def plan_run(cluster: EmulatedCluster, model: str, data: dict[str, Path], args: argparse.Namespace, name: str,
             algorithms: tuple[str, ...]) -> dict:
    """The plan's recommendation (its text, and the algorithm it names or "one machine") and its 2-host step for
    each algorithm, from `shoal plan --hosts host0,host1 --json` run on host0 (it plans 1 and 2 hosts)."""
    job = comm.write_job(cluster.shared, name, model, data["train"], data["test"], args)
    job.write_text(job.read_text().replace("[cluster]\n", f'[cluster]\nremote = "{cluster.enter} {{host}}"\n', 1))
    command = [sys.executable, "-m", "shoal", "plan", str(job), "--hosts", "host0,host1",  # plans 1 and 2 hosts
               "--algorithms", ",".join(algorithms), "--json"]
    try:
        plan = json.loads(cluster.run(0, command, env=comm.environment(OMP_NUM_THREADS="1"), timeout=PLAN_SECONDS))
    except Exception as error:  # a failed plan is a row of the table, not the end of the benchmark
        lines = str(error).strip().splitlines() or [type(error).__name__]
        return {"error": lines[-1][-300:]}
    return planned(plan)


def planned(plan: dict) -> dict:
    """What the benchmark keeps of a plan's JSON: the recommendation, the algorithm it picks, each 2-host step."""
    # "easgd (server)": the plan names the layout beside the algorithm
    two = {row["algorithm"].split(" (")[0]: row for row in plan["predictions"]
           if row["nodes"] == 2 and row.get("balance") is None}
    fastest = max(two.values(), key=lambda row: row["speedup"], default=None)
    text = plan.get("recommendation")
    if text is None:
        choice = None  # withheld: an unsteady measurement
    elif fastest is None or fastest["speedup"] < WORTH_MORE_MACHINES:
        choice = "one machine"
    else:
        choice = fastest["algorithm"]
    return {"recommendation": text, "withheld": plan.get("recommendation_withheld"), "choice": choice,
            "steps": {name: row["epoch_seconds"] / row["steps"] for name, row in two.items() if row["steps"]},
            "speedups": {name: row["speedup"] for name, row in two.items()}}


def planned_goal(plan: dict | None, measured: dict[str, float], limit: float) -> tuple[float | None, bool | None]:
    """(the measured speed-up over one host of what the plan chose, whether that meets the goal): an algorithm must
    measure at least `limit`; "one machine" is right when no algorithm measured WORTH_MORE_MACHINES (the figure is
    then the best one measured). (None, None): no plan, or it withheld its choice."""
    if not plan or "error" in plan or plan.get("choice") is None:
        return None, None
    if plan["choice"] == "one machine":
        best = max(measured.values(), default=None)
        return best, best is not None and best < WORTH_MORE_MACHINES
    value = measured.get(plan["choice"])
    return value, None if value is None else value >= limit
