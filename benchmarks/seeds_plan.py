"""The plan against the seeds' studies, profiled again: how far the plan's error is the profile's.

The seeds' studies (benchmarks.seeds_kennedy, benchmarks.seeds_cneural) each measure a profile on two of the
dilated hosts before they run, and judge the plan by it. One profile is one sample: two of the same machine
put 5 and 12 of Kennedy's 18 cells within 25%. This script keeps the studies' measured trials and measures
the profile again, several times, on the same emulated cluster (16 hosts dilated by D = 8: a host runs 10 ms
turns in 80 ms periods), judging the plan by each profile and by their median (`shoal plan --profile a
--profile b ...`). With `--baseline DIR` (an earlier checkout of shoal) its profiles alternate with this
checkout's, so that the two are compared on one machine in one run.

    .venv/bin/python -m benchmarks.seeds_plan --baseline ../shoal-before   # about 35 minutes; 20 without
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import time
from datetime import date
from pathlib import Path

from tests.cluster.hosts import EmulatedCluster

from benchmarks import seeds_cneural, seeds_kennedy
from benchmarks.common import RESULTS, ROOT, free_stem, hardware_tag, machine_line, require_cluster
from benchmarks.seeds import HOSTS, PLAN_GOAL, PLAN_SHARE, environment
from shoal.bench.analysis import analyze
from shoal.bench.prediction import predict_cells
from shoal.bench.study import read_trials
from shoal.plan.median import median_profile
from shoal.plan.profile import load_profile

STUDIES = {"kennedy": "2026-11-29-2core-cpu-seeds-kennedy", "cneural": "2026-11-29-2core-cpu-seeds-cneural"}


def study_job(name: str, folder: Path, study: Path) -> Path:
    """The study's job file, written as its script wrote it (its data made once under benchmarks/work)."""
    job = json.loads((study / "study.json").read_text())["job"]
    if name == "kennedy":
        return seeds_kennedy.write_job(folder, 2_000_000, job["train"]["epochs"])
    return seeds_cneural.write_job(folder, seeds_cneural.digits(2_000_000), job["train"]["epochs"])


def profile_once(cluster: EmulatedCluster, job: Path, source: Path, out: Path) -> float:
    """`shoal plan --save-profile` of `source`'s code on host0 (the network probed to host1); its seconds."""
    remote = f"'{cluster.enter} {{host}}'"
    saved = cluster.shared / "profile.json"
    env = {**environment(), "PYTHONPATH": f"{source / 'src'}:{ROOT}"}
    began = time.monotonic()
    cluster.run(0, [sys.executable, "-m", "shoal", "plan", str(job), "--hosts", "host0,host1", "--save-profile",
                    str(saved), "--set", f"cluster.remote={remote}"], env=env, timeout=1800)
    shutil.copy2(saved, out)
    return time.monotonic() - began


def judged(study: Path, profile, held_out: bool = True) -> tuple[int, int, list[float]]:
    """(cells at 4 or more nodes within PLAN_GOAL, cells, each cell's predicted over measured)."""
    ratios = [cell.predicted / cell.measured for cell in cells_of(study, profile, held_out)]
    return sum(abs(ratio - 1) <= PLAN_GOAL for ratio in ratios), len(ratios), ratios


def cells_of(study: Path, profile, held_out: bool = True) -> list:
    """The study's cells at 4 or more nodes, each with the plan's prediction from `profile`; without
    `held_out`, planned as though the job held no rows out (as the plan did before it priced
    train.validation_split)."""
    trials = read_trials(study)
    job = json.loads((study / "study.json").read_text())
    if not held_out:
        job["job"]["train"]["validation_split"] = 0.0
    return [cell for cell in predict_cells(job, analyze(trials), trials, profile) if cell.nodes >= 4]


def describe(path: Path, study: Path) -> dict:
    profile = load_profile(path)
    batch = json.loads((study / "study.json").read_text())["job"]["train"]["batch_size"]
    compute = profile.compute
    within, cells, ratios = judged(study, profile)
    steady = dataclasses.replace(profile, compute=dataclasses.replace(compute, pace_range=1.0))
    return {"profile": path.name, "loop_factor": compute.loop_factors.get(batch), "pace_range": compute.pace_range,
            "step_ms": 1000 * compute.step_seconds[batch], "within": within, "cells": cells,
            "steady_within": judged(study, steady)[0], "unpriced_within": judged(study, profile, False)[0],
            "median_ratio": statistics.median(ratios),
            "ratios": [round(ratio, 3) for ratio in ratios]}


def run(args, folder: Path) -> dict:
    """Study -> checkout -> its profiles' files and how long each took, measured in turns."""
    sources = {"this checkout": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    measured: dict = {}
    with EmulatedCluster(hosts=HOSTS, rate="1gbit", dilation=args.dilation) as cluster:
        for name in args.studies.split(","):
            job = study_job(name, cluster.shared, RESULTS / STUDIES[name])
            measured[name] = {label: [] for label in sources}
            for index in range(args.profiles):
                for label, source in sources.items():  # alternated: a slow spell of the machine weighs on both
                    path = folder / f"profile-{name}-{label.split()[0]}-{index + 1}.json"
                    seconds = profile_once(cluster, job, source, path)
                    measured[name][label].append({"profile": path.name, "seconds": round(seconds, 1)})
                    print(json.dumps({"study": name, "source": label, **describe(path, RESULTS / STUDIES[name])}),
                          flush=True)
    return measured


def judge(measured: dict, folder: Path) -> dict:
    """Each profile described and judged by this checkout's plan, and the median of each checkout's profiles."""
    found: dict = {}
    for name, sources in measured.items():
        study = RESULTS / STUDIES[name]
        for label, rows in sources.items():
            found.setdefault(name, {})[label] = [{**describe(folder / row["profile"], study), **row} for row in rows]
            paths = [folder / row["profile"] for row in rows]
            median = median_profile([(path, load_profile(path)) for path in paths])
            within, cells, ratios = judged(study, median)
            found[name][label].append({"profile": "median", "within": within, "cells": cells,
                                       "median_ratio": statistics.median(ratios),
                                       "ratios": [round(ratio, 3) for ratio in ratios]})
            found[name].setdefault("cells", [{"rows": cell.rows, "nodes": cell.nodes, "measured": cell.measured}
                                             for cell in cells_of(study, median)])
    return found


def report(found: dict, args, minutes: float) -> str:
    lines = [f"# The plan against the seeds' studies, profiled {args.profiles} times again\n",
             f"The goal: the plan within {PLAN_GOAL:.0%} of the measured epoch for {PLAN_SHARE:.0%} of the cells "
             "at 4 to 16 hosts. The measured trials are the studies' own (benchmarks/results/"
             f"{', '.join(STUDIES[name] for name in found)}); only the profile is measured again. Every profile "
             "is judged by this checkout's plan; the column \"held-out rows unpriced\" by the plan as it was before "
             "it priced train.validation_split (Kennedy's worker holds out a fifth).\n",
             *([f"{args.note}\n"] if args.note else [])]
    for name, sources in found.items():
        lines += [f"## {name}\n", "| code | profile | s | loop factor | pace range | probed step ms | within 25% | "
                  "steady pace: within | held-out rows unpriced: within | median predicted / measured |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        labels = [label for label in sources if label != "cells"]
        for label in labels:
            for row in sources[label]:
                lines.append(f"| {label} | {row['profile']} | {row.get('seconds') or ''} | "
                             f"{_number(row.get('loop_factor'))} | {_number(row.get('pace_range'))} | "
                             f"{_number(row.get('step_ms'))} | {row['within']} of {row['cells']} | "
                             f"{row.get('steady_within', '')} | {row.get('unpriced_within', '')} | "
                             f"{row['median_ratio']:.2f} |")
        medians = {label: sources[label][-1]["ratios"] for label in labels}
        lines += ["", "Predicted over measured per cell, from each checkout's median profile:", "",
                  "| rows | nodes | measured s | " + " | ".join(labels) + " |",
                  "| ---: | ---: | ---: | " + " | ".join("---:" for _ in labels) + " |"]
        lines += [f"| {cell['rows']:,} | {cell['nodes']} | {cell['measured']:.3f} | "
                  + " | ".join(f"{medians[label][index]:.2f}" for label in labels) + " |"
                  for index, cell in enumerate(sources["cells"])]
        lines.append("")
    lines.append(f"## How this result was made\n\n`python -m benchmarks.seeds_plan --profiles {args.profiles}"
                 f"{' --baseline <checkout>' if args.baseline else ''}`{took(minutes)} on {machine_line()}: "
                 f"the emulated cluster of {HOSTS} hosts dilated by D = {args.dilation}; each profile is `shoal plan "
                 "--hosts host0,host1 --save-profile` run on host0, the checkouts' profiles taken in turn. The "
                 "profiles are kept beside this file.\n")
    return "\n".join(lines)


def took(minutes: float | None) -> str:
    return "" if minutes is None else f" ({minutes:.0f} minutes)"


def _number(value) -> str:
    return "" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=int, default=3, help="profiles per study and checkout")
    parser.add_argument("--studies", default="kennedy,cneural")
    parser.add_argument("--baseline", type=Path, help="an earlier checkout of shoal, profiled in turn with this one")
    parser.add_argument("--dilation", type=int, default=8)
    parser.add_argument("--note", help="a paragraph for the report: what this run's code is")
    parser.add_argument("--report-only", type=Path, metavar="FOLDER", help="judge the profiles measured into "
                        "FOLDER again with this checkout's plan; nothing is measured")
    args = parser.parse_args(argv)
    if not args.report_only:
        require_cluster("benchmarks.seeds_plan", HOSTS, args.dilation)
    folder = args.report_only or RESULTS / free_stem(f"{date.today().isoformat()}-{hardware_tag()}-seeds-plan")
    folder.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    if args.report_only:
        measured = json.loads((folder / "measured.json").read_text())
        minutes = measured.pop("minutes")
    else:
        measured = run(args, folder)
        minutes = (time.monotonic() - began) / 60
        (folder / "measured.json").write_text(json.dumps({**measured, "minutes": minutes}, indent=1))
    found = judge(measured, folder)
    (folder / "results.json").write_text(json.dumps(found, indent=1))
    (folder / "report.md").write_text(report(found, args, minutes))
    print(f"results: {folder}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
