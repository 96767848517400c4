"""`shoal plan`'s predictions against measured epochs on the emulated cluster.

For each link rate (1 Gbit/s, 100 Mbit/s, 10 Mbit/s) an emulated cluster of 2 hosts (each its
own core, 1 worker of 1 thread) is built; `shoal plan --hosts host0,host1` runs on host0 and
measures there (compute for each model, the network between the hosts, saved as a profile);
then every job is trained for real, on one host (1 worker) and on two (sync, averaging, Downpour
with its server on host0), at batch 128 and 1024, for two model sizes (784-40-10 and 784-256-10
on MNIST-shaped digits), and the mean of its epochs after the first (at least 2 of them, and
enough to add up to 3 s) is one run's epoch. The jobs run in RUNS passes, each after a calibration
of its own; jobs predicted under 5 s an epoch run in every pass, longer ones (where the link's time
dominates) in the first. Each job is then planned from the median of the RUNS profiles and
compared with its median run: a VM's slow spells last minutes, and one spoils one profile and one
run, not the comparison. Each run is also bracketed by the calibration's probed step, timed on each of
its hosts alone (benchmarks.pace): the score is given a second time with each prediction's compute
taken at that pace, so that the machine's drift since calibration is told apart from the model's miss
(as far as the timings around a run hold through it).
Downpour needs a server and a trainer, so it has no one-host row. Needs root, `ip`, `tc`, 2 cores.

    .venv/bin/python -m benchmarks.plan            # about 60 minutes on 2 cores
    .venv/bin/python -m benchmarks.plan --quick    # one model, batch 128, 1gbit and 10mbit
    .venv/bin/python -m benchmarks.plan --rates 1gbit --runs 5 --seconds 6   # more of each, one link
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.hosts import EmulatedCluster, missing_requirements, unset_interfaces
from tests.cluster.jobs import log_of, start_on_hosts

from benchmarks.common import ROOT, WORK, machine, machine_line, write_result
from shoal.data.synthetic import synth_digits
from shoal.events import read_history
from shoal.plan.profile import load_profile
from shoal.plan.render import UNSTEADY

RATES = {"1gbit": 100_000, "100mbit": 40_000, "10mbit": 4_000}  # link -> training rows (fewer where slow)
MODELS = {"784-40-10": 40, "784-256-10": 256}
ALGORITHMS = ("sync", "averaging", "downpour")
BATCHES = (128, 1024)
GOAL = 0.15
MEASURED_SECONDS = 3.0  # at least, per job: the epochs after the first (--seconds)
MOST_EPOCHS = 30  # at 3 s; in proportion to --seconds
RUNS = 3  # calibrations per link, each followed by a pass measuring the short jobs (minutes apart; --runs)
REPEAT_BELOW = 5.0  # predicted seconds per epoch under which a job is measured in every pass


@dataclass(frozen=True)
class Protocol:
    """How much each link is measured: `runs` calibrations and passes (odd: a median is one of them), and at
    least `seconds` of epochs after the first in each run."""
    runs: int = RUNS
    seconds: float = MEASURED_SECONDS


def write_job(folder: Path, train: Path, model: str, algorithm: str, batch: int, remote: Path, epochs: int = 3) -> Path:
    path = folder / f"{model}-{algorithm}-{batch}-{train.name}.toml"
    path.write_text(f"""
[model]
input = [784]
layers = [{{ dense = {MODELS[model]}, activation = "sigmoid" }}, {{ dense = 10 }}]
[data]
train = "{train}"
[algorithm]
name = "{algorithm}"
[train]
epochs = {epochs}
batch_size = {batch}
optimizer = {{ name = "sgd", lr = 0.1, momentum = 0.9 }}
[checkpoint]
every = 0
[cluster]
threads = 1
timeout = 900
remote = "{remote} {{host}}"
[output]
progress = "none"
""")
    return path


def epochs_for(epoch_seconds: float, seconds: float = MEASURED_SECONDS) -> int:
    """Enough epochs that those measured (all but the first) add up to `seconds`: a 0.1 s epoch moves by tens
    of percent from one to the next on a VM, a mean over twenty does not."""
    most = round(MOST_EPOCHS * max(1.0, seconds / MEASURED_SECONDS))
    return 1 + min(max(2, math.ceil(seconds / max(epoch_seconds, 1e-3))), most - 1)


def environment() -> dict:
    return dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")


def predicted(cluster: EmulatedCluster, job: Path, profiles: list[Path], algorithm: str,
              save: Path | None = None) -> dict:
    """`shoal plan` on host0 for 1 and 2 nodes, from `profiles` (their median; measured when there are none,
    completed where they lack the job's batch size): node count -> its prediction."""
    command = [sys.executable, "-m", "shoal", "plan", str(job), "--hosts", "host0,host1", "--algorithms", algorithm,
               "--json", *[part for path in profiles for part in ("--profile", str(path))]]
    if save is not None:
        command += ["--save-profile", str(save)]
    plan = json.loads(cluster.run(0, command, env=environment(), timeout=900))
    return {row["nodes"]: {**row, "pace_range": plan["pace_range"]} for row in plan["predictions"]}


def calibrated(cluster: EmulatedCluster, train: Path, model: str, batches: list[int], sample: Path) -> None:
    """One calibration for `model`: compute on host0, the network between the hosts, the loop at each batch.
    Its job files are its own: the measured sync jobs' files keep their epoch counts."""
    folder = cluster.shared / "calibration"
    folder.mkdir(exist_ok=True)
    for batch in batches:
        job = write_job(folder, train, model, "sync", batch, cluster.enter)
        predicted(cluster, job, [sample] if sample.exists() else [], "sync,downpour", save=sample)  # messages too


def later_epochs(run_dir: Path) -> dict:
    """The mean of the epochs after the first (which warms up)."""
    epochs = read_history(run_dir).epochs[1:]
    return {"seconds": statistics.mean(epoch.seconds for epoch in epochs),
            "communication": statistics.mean(epoch.seconds_split.communication for epoch in epochs)}


class HostPace:
    """A `benchmarks.pace` process on a host of the cluster (stopped with the cluster's processes)."""

    def __init__(self, cluster: EmulatedCluster, host: int):
        command = cluster.command(host, [sys.executable, "-m", "benchmarks.pace"])
        self.process = subprocess.Popen(command, env=unset_interfaces(environment()), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, bufsize=1, start_new_session=True)
        cluster.processes.append(self.process)

    def step(self, job: Path, batch: int) -> float:
        """Seconds of the probed step of `job`'s model at `batch` on this host now."""
        self.process.stdin.write(f"{job} {batch}\n")
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"benchmarks.pace ended (status {self.process.wait(timeout=10)}) timing {job}")
        return json.loads(answer)["step"]


def probed_steps(paces: list[HostPace], job: Path, batch: int) -> list[float]:
    """The probed step on each host in turn, each timed alone: the machine's drift, not the run's contention."""
    return [pace.step(job, batch) for pace in paces]


def measured(cluster: EmulatedCluster, job: Path, nodes: int, name: str, paces: list[HostPace], batch: int) -> dict:
    """One run's epoch (the mean of those after the first) and the probed step timed on its hosts right before
    and after it."""
    before = probed_steps(paces[:nodes], job, batch)
    run_dir = cluster.shared / name
    launchers = start_on_hosts(cluster, str(job), run_dir, environment(), nodes)
    for host, launcher in enumerate(launchers):
        if launcher.wait(timeout=1800) != 0:
            raise RuntimeError(f"{name} host {host}: {log_of(cluster, run_dir, host)[-2000:]}")
    return {**later_epochs(run_dir), "pace_steps": before + probed_steps(paces[:nodes], job, batch)}


def runs_for(epoch_seconds: float, runs: int = RUNS) -> int:
    """Measurements of a job: `runs` of short ones, whose compute this VM's slow spells (minutes long) move by
    10-30% from one run to the next; one of long ones, where the link's time dominates and holds still."""
    return runs if epoch_seconds < REPEAT_BELOW else 1


def run_rate(rate: str, rows: int, models: list[str], batches: list[int], one_host: bool,
             protocol: Protocol = Protocol()) -> list[dict]:
    """The link's jobs measured in up to `protocol.runs` passes, each after a calibration of its own (a job's
    runs and the profiles minutes apart, so that one slow spell spoils one of each); every job then planned
    from the median of the profiles (`shoal plan --profile` repeated) and compared with its median run."""
    train = WORK / f"digits-{rows}"
    if not train.exists():
        synth_digits(train, rows, seed=1)
    with EmulatedCluster(hosts=2, rate=rate) as cluster:
        paces = [HostPace(cluster, host) for host in range(2)]
        samples = {model: [cluster.shared / f"profile-{model}-{run}.json" for run in range(protocol.runs)]
                   for model in models}
        planned = []
        for run in range(protocol.runs):
            for model in models:
                calibrated(cluster, train, model, batches, samples[model][run])
            if run == 0:
                planned = jobs_of(cluster, train, rows, models, batches, one_host, samples, protocol.seconds)
            measure_pass(cluster, planned, run, paces, protocol.runs)
        for entry in planned:
            row = entry["row"]
            plan = predicted(cluster, entry["job"], samples[row["model"]], row["algorithm"])
            entry["plan"] = {**plan[row["nodes"]], "calibrated_step": calibrated_step(samples[row["model"]],
                                                                                     row["batch"])}
        profiles = [{"profile": json.loads(path.read_text()), "rate": rate, "model": model, "calibration": run}
                    for model in models for run, path in enumerate(samples[model])]
    return [compared(entry["row"], entry["plan"], entry["runs"]) for entry in planned] + profiles


def jobs_of(cluster: EmulatedCluster, train: Path, rows: int, models: list[str], batches: list[int],
            one_host: bool, samples: dict, seconds: float = MEASURED_SECONDS) -> list[dict]:
    """Every job of the link, written with enough epochs by the first calibration's prediction."""
    planned = []
    for model in models:
        for algorithm in ALGORITHMS:
            for batch in batches:
                job = write_job(cluster.shared, train, model, algorithm, batch, cluster.enter)
                first = predicted(cluster, job, samples[model][:1], algorithm)
                job = write_job(cluster.shared, train, model, algorithm, batch, cluster.enter,
                                epochs_for(min(row["epoch_seconds"] for row in first.values()), seconds))
                for nodes in ((1, 2) if one_host and algorithm != "downpour" else (2,)):
                    planned.append({"job": job, "first": first[nodes]["epoch_seconds"], "runs": [], "row": {
                        "rate": cluster.rate if nodes == 2 else "-", "rows": rows, "model": model,
                        "algorithm": algorithm, "batch": batch, "nodes": nodes}})
    return planned


def calibrated_step(profiles: list[Path], batch: int) -> float:
    """The median over the calibrations of their probed step at `batch`: the pace the prediction assumes."""
    return statistics.median(load_profile(path).compute.step_seconds[batch] for path in profiles)


def measure_pass(cluster: EmulatedCluster, planned: list[dict], run: int, paces: list[HostPace],
                 runs: int = RUNS) -> None:
    """Pass `run` over the link's jobs: every job the first calibration predicts short, the rest in pass 0."""
    for entry in planned:
        if run < runs_for(entry["first"], runs):
            row = entry["row"]
            name = f"{row['model']}-{row['algorithm']}-{row['batch']}-{row['nodes']}-{run}"
            entry["runs"].append(measured(cluster, entry["job"], row["nodes"], name, paces, row["batch"]))
            print(f"{cluster.rate} {name}: first predicted {entry['first']:.2f} s, measured "
                  f"{entry['runs'][-1]['seconds']:.2f} s", flush=True)


def compared(row: dict, plan: dict, runs: list[dict]) -> dict:
    """The row with its prediction, its runs and the error of the prediction against their median."""
    seconds = [run["seconds"] for run in runs]
    median_run = sorted(runs, key=lambda run: run["seconds"])[len(runs) // 2]  # an odd number: the middle one
    row = {**row, "predicted": plan["epoch_seconds"], "predicted_communication": plan["communication_seconds"],
           "measured": median_run["seconds"], "measured_communication": median_run["communication"],
           "runs": seconds, "pace_range": plan["pace_range"]}
    row["error"] = row["predicted"] / row["measured"] - 1
    if "pace_steps" in median_run:
        # the pace each run's hosts showed, over the pace its calibrations showed
        row["run_paces"] = [statistics.mean(run["pace_steps"]) / plan["calibrated_step"] for run in runs]
        row["pace"] = row["run_paces"][runs.index(median_run)]
        row["error_at_pace"] = error_at_pace(plan["compute_seconds"], plan["communication_seconds"], row)
    return row


def error_at_pace(compute: float, communication: float, row: dict) -> float:
    """A prediction's error against `row`'s measured epoch with its compute at the row's pace (its communication
    as predicted)."""
    return (compute * row["pace"] + communication) / row["measured"] - 1


def table(rows: list[dict]) -> str:
    lines = ["| link | rows | model | algorithm | batch | hosts | predicted s/epoch | measured s/epoch (median) | "
             "its runs | error | predicted comm. | measured comm. | pace range | pace at run | error at that pace |",
             "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        runs = ", ".join(f"{seconds:.3f}" for seconds in row["runs"])
        lines.append(f"| {row['rate']} | {row['rows']:,} | {row['model']} | {row['algorithm']} | {row['batch']} | "
                     f"{row['nodes']} | {row['predicted']:.3f} | {row['measured']:.3f} | {runs} | "
                     f"{row['error']:+.1%} | {row['predicted_communication']:.3f} | "
                     f"{row['measured_communication']:.3f} | {row['pace_range']:.2f}x | {at_pace(row)} |")
    return "\n".join(lines)


def at_pace(row: dict) -> str:
    return f"{row['pace']:.2f}x | {row['error_at_pace']:+.1%}" if "pace" in row else "- | -"


def scored(errors: list[float]) -> tuple[int, float, float]:
    """(how many of `errors` are within GOAL, their median and their largest, in size)."""
    sizes = [abs(error) for error in errors]
    return sum(size <= GOAL for size in sizes), statistics.median(sizes), max(sizes)


def pace_line(rows: list[dict]) -> str:
    """The score with each prediction's compute taken at the pace its median run's hosts showed."""
    errors = [row["error_at_pace"] for row in rows if "error_at_pace" in row]
    if not errors:
        return ""
    paces = [row["pace"] for row in rows if "pace" in row]
    within, median, largest = scored(errors)
    return (f"At the pace the hosts showed around each median run (the calibration's probed step timed on each "
            f"host alone right before and after it, over the calibrations' median; {min(paces):.2f}x to "
            f"{max(paces):.2f}x), **{within} of {len(errors)} within {GOAL:.0%}, median {median:.1%}, largest "
            f"{largest:.1%}**: the drift since calibration that the timings around the run saw, taken out; a pace "
            "that moves within the run is not.")


def unsteady_line(rows: list[dict]) -> str:
    """How many predictions, and misses, came from profiles that the plan called unsteady (its pace range)."""
    unsteady = [row for row in rows if row["pace_range"] > UNSTEADY]
    missed = [row for row in rows if abs(row["error"]) > GOAL]
    return (f"The plan called its profiles unsteady (timings of a step over {UNSTEADY}x apart) for {len(unsteady)} "
            f"of {len(rows)} predictions; {sum(row in unsteady for row in missed)} of the {len(missed)} misses are "
            "among them (the pace range column).")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one model, batch 128, 1gbit and 10mbit")
    parser.add_argument("--rates", help="comma-separated subset of " + ",".join(RATES))
    parser.add_argument("--runs", type=int, default=RUNS,
                        help=f"calibrations and passes per link, odd (default {RUNS})")
    parser.add_argument("--seconds", type=float, default=MEASURED_SECONDS,
                        help=f"at least this much of each run's epochs is measured (default {MEASURED_SECONDS:.0f})")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.runs < 1 or args.runs % 2 == 0 or args.seconds <= 0:
        parser.error("--runs must be odd and positive (a median is one of the runs), --seconds positive")
    reason = missing_requirements(2)
    if reason:
        sys.exit(f"benchmarks.plan: {reason}")
    protocol = Protocol(args.runs, args.seconds)
    command = " ".join(["python -m benchmarks.plan", *argv])
    rates = args.rates.split(",") if args.rates else (["1gbit", "10mbit"] if args.quick else list(RATES))
    models = list(MODELS)[:1] if args.quick else list(MODELS)
    batches = [128] if args.quick else list(BATCHES)
    began, found, path = time.monotonic(), [], None
    for number, rate in enumerate(rates):
        found += run_rate(rate, RATES[rate], models, batches, one_host=number == 0, protocol=protocol)
        # after every link: a crash keeps the rest
        path = write(found, args.quick, time.monotonic() - began, path, protocol, command)
    print(path.read_text())
    print(f"written: {path}")


def write(found: list[dict], quick: bool, seconds: float, earlier: Path | None, protocol: Protocol = Protocol(),
          command: str = "python -m benchmarks.plan") -> Path:
    rows = [row for row in found if "error" in row]
    within, median, largest = scored([row["error"] for row in rows])
    info = machine()
    markdown = f"""# shoal plan: predicted against measured epoch times

{machine_line(info)}; the emulated cluster: 2 network namespaces on a bridge, each host pinned to its
own core with 1 worker of 1 thread, its link shaped with `tc tbf` (a bucket of 128 µs of the line, at
least a frame; no netem: no added latency).
`shoal plan --hosts host0,host1` ran on host0: it measured compute there for each model and the
network between the hosts into a profile, {protocol.runs} times per link, each calibration followed by a pass
over the link's jobs; each job trained for at least 3 epochs (more where epochs are short, so that
those measured add up to {protocol.seconds:g} s), a run's epoch is the mean of its epochs after the
first, and jobs predicted under {REPEAT_BELOW:.0f} s an epoch ran in every pass, longer ones in the first.
Each prediction is `shoal plan` from the median of the link's {protocol.runs} profiles of the model (`--profile`
repeated), compared with the job's median run. MNIST-shaped digits,
SGD with momentum; Downpour's server is host0's worker, its one trainer host1's.
`.venv/bin/{command}`
({seconds:.0f} s).

**{within} of {len(rows)} predictions within {GOAL:.0%} of the measurement; median error
{median:.1%}, largest {largest:.1%}.** {unsteady_line(rows)}

{pace_line(rows)}

{table(rows)}
"""
    return write_result("plan-quick" if quick else "plan", markdown, {"machine": info, "results": found}, earlier)


if __name__ == "__main__":
    main()
