"""The Parallel SGD study across machines: training time against dataset size and host count, per link.

The study of benchmarks/scaling.py (synthetic Medicare claims under-sampled to the paper's
ratios, its Keras model, weights averaged every epoch), run with `shoal bench scaling --hosts`
on the emulated cluster (tests/cluster/hosts.py: network namespaces, each host its own core and
a tbf-shaped link): every trial on 1 or 2 hosts with 1 worker each, started from one terminal
through the cluster's stand-in for ssh, once per link rate. Copies each rate's report, tables,
plots and trials, with a report by wall time (process start to end: the per-node fixed cost
the paper's Figure 3 shows) beside the one by training time, into
benchmarks/results/<date>-<hardware>-cluster-scaling/<rate>/. Needs root, `ip`, `tc`, 2 cores.

    .venv/bin/python -m benchmarks.cluster_scaling            # about 15 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from datetime import date

from tests.cluster.hosts import EmulatedCluster, missing_requirements

from benchmarks.common import RESULTS, ROOT, hardware_tag, machine_line
from benchmarks.scaling import write_claims_job

COPIED = ("report.md", "trials.csv", "anova.csv", "tukey.csv", "study.json")


def study(cluster: EmulatedCluster, job, ratios: str, trials: int, folder) -> float:
    """The study on this cluster, its results copied into `folder`; the minutes it took."""
    out = cluster.shared / "study"
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "shoal", "bench", "scaling", str(job), "--ratios", ratios, "--workers", "1",
                    "--hosts", "host0,host1", "--trials", str(trials), "--out", str(out), "--no-progress",
                    "--set", f"cluster.remote='{cluster.enter} {{host}}'"], check=True, env=env, cwd=ROOT)
    minutes = (time.perf_counter() - began) / 60
    folder.mkdir(parents=True, exist_ok=True)
    for name in (*COPIED, *(path.name for path in out.glob("*.png"))):
        shutil.copy2(out / name, folder / name)
    # the same trials by wall time: the per-node fixed cost (start-up, rendezvous, loading) included
    subprocess.run([sys.executable, "-m", "shoal", "bench", "report", str(out), "--measure", "wall_seconds"],
                   check=True, env=env, cwd=ROOT, capture_output=True)
    shutil.copy2(out / "report.md", folder / "report-wall.md")
    for path in out.glob("*.png"):
        shutil.copy2(path, folder / f"wall-{path.name}")
    return minutes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="synthetic claims rows to draw the sizes from")
    parser.add_argument("--ratios", default="1:1,1:10,1:100,1:1000")
    parser.add_argument("--rates", default="1gbit,10mbit")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    reason = missing_requirements(2)
    if reason:
        sys.exit(f"benchmarks.cluster_scaling: {reason}")
    job = write_claims_job(args.rows, args.epochs, args.batch_size)
    results = RESULTS / f"{date.today().isoformat()}-{hardware_tag()}-cluster-scaling"
    for rate in args.rates.split(","):
        folder = results / rate
        with EmulatedCluster(hosts=2, rate=rate) as cluster:
            minutes = study(cluster, job, args.ratios, args.trials, folder)
        note = (f"\n## How this result was made\n\n`python -m benchmarks.cluster_scaling` ({minutes:.0f} minutes) on "
                f"{machine_line()}: the emulated cluster, 2 hosts each pinned to its own core, links shaped to "
                f"{rate} with tc tbf; {args.rows:,} synthetic claims rows, ratios {args.ratios}, 1 worker per host "
                f"(1 thread), {args.trials} trials per cell, {args.epochs} epochs at batch {args.batch_size}, weights "
                "averaged every epoch; each trial started from one terminal (`shoal train --hosts`). "
                "`report-wall.md` and `wall-*.png`: the same trials by wall time (process start to end).\n")
        for name in ("report.md", "report-wall.md"):
            with open(folder / name, "a", encoding="utf-8") as handle:
                handle.write(note)
        print(f"results: {folder}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
