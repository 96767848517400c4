"""What the seeds' scaling studies share: `shoal bench scaling` on the emulated cluster of 16 dilated hosts, the
plan's profile measured on two of them first, the study's files kept, and the plan's error per cell at 4 or more
nodes against the goal (within 25% for 80% of the cells)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.cluster.hosts import EmulatedCluster

from benchmarks import comm
from benchmarks.common import ROOT, machine_line
from shoal.bench.analysis import analyze
from shoal.bench.prediction import predict_cells
from shoal.plan.profile import load_profile

HOSTS = 16
PLAN_GOAL, PLAN_SHARE = 0.25, 0.80
COPIED = ("report.md", "trials.csv", "anova.csv", "anova-two-way.csv", "tukey.csv", "study.json")


def environment() -> dict:
    return comm.environment(OMP_NUM_THREADS="1")


def synth(kind: str, rows: int, seed: int, out: Path) -> Path:
    """`shoal data synth KIND` into `out`, made once (a later run finds it there)."""
    if not out.exists():
        subprocess.run([sys.executable, "-m", "shoal", "data", "synth", kind, "--rows", str(rows), "--seed",
                        str(seed), "--out", str(out)], check=True, env=environment(), cwd=ROOT)
    return out


def save_profile(cluster: EmulatedCluster, job: Path, remote: str) -> Path:
    """`shoal plan --hosts host0,host1 --save-profile` run on host0: a dilated host's compute and link."""
    profile = cluster.shared / "profile.json"
    cluster.run(0, [sys.executable, "-m", "shoal", "plan", str(job), "--hosts", "host0,host1", "--save-profile",
                    str(profile), "--set", f"cluster.remote={remote}"], env=environment(), timeout=1800)
    return profile


def run_study(cluster: EmulatedCluster, job: Path, sizes: list[str], nodes: str, trials: int, dilation: int,
              folder: Path, earlier: Path | None = None) -> Path:
    """The profile, then `shoal bench scaling job *sizes` on one worker a host for each count of `nodes`; the
    study's files and the profile copied into `folder`. Returns the study's folder (in the cluster's). With
    `earlier` (a result folder of the same job), its trials are kept and only the cells' missing trials run,
    as `shoal bench scaling` goes on with a study it finds."""
    remote = f"'{cluster.enter} {{host}}'"
    profile = save_profile(cluster, job, remote)
    out = cluster.shared / "study"
    if earlier is not None:
        out.mkdir()
        for name in ("study.json", "trials.csv"):
            shutil.copy2(earlier / name, out / name)
    hosts = ",".join(cluster.hostname(host) for host in range(HOSTS))
    subprocess.run([sys.executable, "-m", "shoal", "bench", "scaling", str(job), *sizes, "--workers", "1",
                    "--hosts", hosts, "--nodes", nodes, "--trials", str(trials), "--out", str(out), "--no-progress",
                    "--profile", str(profile), "--set", f"cluster.remote={remote}",
                    "--set", f"cluster.timeout={300 * dilation}"], check=True, env=environment(), cwd=ROOT)
    folder.mkdir(parents=True, exist_ok=True)
    for name in (*COPIED, *(path.name for path in out.glob("*.png"))):
        if (out / name).exists():
            shutil.copy2(out / name, folder / name)
    shutil.copy2(profile, folder / "profile.json")
    shutil.copy2(profile, out / "profile.json")
    return out


def how_made(script: str, minutes: float, dilation: int, workload: str) -> str:
    """The note both a study's report and its counterpart end with: the command, the cluster, `workload`."""
    return (f"\n## How this result was made\n\n`python -m benchmarks.{script}` ({minutes:.0f} minutes) on "
            f"{machine_line()}: the emulated cluster of {HOSTS} hosts dilated by D = {dilation} (each host "
            f"1/{dilation} of a core and of a 1 Gbit/s link); {workload} Seconds are the dilated cluster's; divide "
            f"by {dilation} for the machines it stands for (counterpart.md does).\n")


def resumed(earlier: Path | None, kept: int) -> str:
    """What the note says of a study that went on with an earlier result's trials (`--resume`)."""
    if earlier is None:
        return ""
    return (f" {kept} of the trials were kept from an earlier result of this study (the same job, code of training "
            "and machine) and the others run now, in the study's random order.")


def write_results(folder: Path, counterpart: str, note: str) -> None:
    """`note` added to the study's report.md; counterpart.md written: `counterpart`, then the same note."""
    with open(folder / "report.md", "a", encoding="utf-8") as handle:
        handle.write(note)
    (folder / "counterpart.md").write_text(counterpart + note)


def plan_errors(study: Path, trials: list[dict], profile_path: Path | None = None) -> str:
    """How far the plan's prediction (from the profile saved in `study`, or `profile_path`) is from each measured
    cell at 4 or more nodes: the count within PLAN_GOAL, against the goal of PLAN_SHARE of the cells; and the same
    with the profile's pace range set to 1 (see STEADY)."""
    profile = load_profile(profile_path or study / "profile.json")
    steady = dataclasses.replace(profile, compute=dataclasses.replace(profile.compute, pace_range=1.0))
    job, analysis = json.loads((study / "study.json").read_text()), analyze(trials)
    judged = [cell for cell in predict_cells(job, analysis, trials, profile) if cell.nodes >= 4]
    calmed = [cell for cell in predict_cells(job, analysis, trials, steady) if cell.nodes >= 4]
    lines = ["| rows | nodes | measured s | predicted s | predicted / measured | steady pace: predicted / measured |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {cell.rows:,} | {cell.nodes} | {cell.measured:.3f} | {cell.predicted:.3f} | "
              f"{cell.predicted / cell.measured:.2f} | {calm.predicted / calm.measured:.2f} |"
              for cell, calm in zip(judged, calmed, strict=True)]
    return (f"The plan at 4 to 16 nodes (dilated seconds; the ratio does not change with D): {verdict(judged)}; with "
            f"the profile's pace range ({profile.compute.pace_range:.2f}) set to 1: {verdict(calmed)}. {STEADY}\n\n"
            + "\n".join(lines) + "\n")


STEADY = ("The profile's pace range is its slowest probe round over its fastest, which the plan reads as a VM's "
          "spells of seconds: each of N workers slow half the time, the slowest of them at the slow end but for a "
          "2^-N share. On a dilated host the range is the quota's: a probe round of a few steps either fits the "
          "host's 10 ms turn or waits out the rest of its period, and over an epoch of steps every host gets the "
          "same share, so no worker runs slower than the others for long.")


def verdict(cells: list) -> str:
    within = [cell for cell in cells if abs(cell.predicted / cell.measured - 1) <= PLAN_GOAL]
    share = len(within) / len(cells)
    return (f"{len(within)} of {len(cells)} cells within {PLAN_GOAL:.0%} ({share:.0%}; goal {PLAN_SHARE:.0%}: "
            f"{'met' if share >= PLAN_SHARE else 'missed'})")
