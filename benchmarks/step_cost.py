"""What a step costs: shoal's algorithms against hand-written loops and the raw exchange of the same bytes.

On the emulated cluster (tests/cluster/hosts.py: 2 network namespaces, each host its own core, a
tbf-shaped link, 1 Gbit/s unless `--link` says otherwise), four models of benchmarks/comm_models.py
(the comm benchmark's MLP and CNN, cNeural's 784-40-10 perceptron and a CNN whose dense head holds
~46k parameters) train synthetic digits, batch 128 per trainer, SGD with momentum, every trainer
taking the same steps an epoch (`--rows` rows each). Per model, each of these, in one run:

- hand: a hand-written single-process PyTorch loop on host0 (benchmarks/comm_ddp.py, `--hook none`):
  the compute floor of the same rows;
- alone: shoal with one worker on host0 and the same rows (its loop against the hand loop);
- ddp: the hand-written DDP loop over gloo on both hosts (benchmarks/peer_ddp.ddp_epoch);
- all-reduce and round trip: the raw gloo all-reduce of the model's gradient bytes between the hosts,
  and a send and receive of them there and back (benchmarks/step_cost_wire.py);
- shoal's `sync`, `averaging`, `downpour` and `easgd` on both hosts, each with its defaults (averaging
  once an epoch; EASGD asynchronous, every 4 steps). Downpour and asynchronous EASGD make rank 0 (host0)
  their server: their one trainer (host1) gets one host's rows, so it takes the same steps as the others.

Per run: seconds a step (the median of the epochs after the first, each epoch's seconds over its steps,
evaluation excluded) and, for shoal, the step's split from its epoch_end events (compute, communication,
data; "other" is what the split leaves out) and the wait per exchange against the raw operation that
moves the same bytes. The variants are interleaved: every round runs each once (in a rotated order),
and each figure is the median over `--runs` rounds, its spread (max - min over the median) beside it.
Beside them the issue's goals: sync's step no slower than DDP's (as the ratio of the medians, and as
the median of each round's ratio, which a slow spell of the machine weighs on alike); sync's exchange
wait a step within 1.15x of the raw all-reduce; Downpour's update within 1.3x of the raw round trip;
one worker's loop within 1.03x of the hand loop; sync's spread between runs no wider than DDP's; and
the fastest algorithm at least 1.6x faster on the 2 hosts than one host training the same rows
("x one host": one worker alone's step twice over for sync and averaging, whose 2 trainers take a
step together; once for Downpour and EASGD, whose one trainer does). Results are written as they come
(benchmarks/results/*-step-cost.md and .json). Needs root, `ip` and `tc`, and 2 cores that nothing else uses.

    .venv/bin/python -m benchmarks.step_cost            # about 10-12 minutes on 2 quiet cores
    .venv/bin/python -m benchmarks.step_cost --quick    # a smoke run of every path: tiny data, one round
    .venv/bin/python -m benchmarks.step_cost --models mlp --variants hand,ddp,sync --runs 5
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from tests.cluster.hosts import EmulatedCluster, missing_requirements

from benchmarks import comm
from benchmarks.comm_models import MODELS, parameters, step_bytes
from benchmarks.common import machine, machine_line, median, write_result
from benchmarks.step_cost_plan import plan_run, planned_goal
from shoal.errors import ConfigError
from shoal.events import History
from shoal.plan.calibrate import parse_rate

MODEL_NAMES = ("mlp", "cnn", "perceptron", "cnn-dense")
VARIANTS = ("hand", "alone", "ddp", "wire", "sync", "averaging", "downpour", "easgd", "plan")
ALGORITHMS = ("sync", "averaging", "downpour", "easgd")
SERVED = ("downpour", "easgd")  # rank 0 serves, one trainer: it takes one host's rows
LABELS = {"hand": "hand loop, one process (compute floor)", "alone": "shoal, one worker alone",
          "ddp": "hand DDP loop (gloo)", "all_reduce": "raw all-reduce of the gradients",
          "round_trip": "raw round trip of the gradients", "sync": "shoal sync", "averaging": "shoal averaging",
          "downpour": "shoal downpour", "easgd": "shoal easgd"}
RAW_KINDS = ("all_reduce", "round_trip")
RAW_OF = {"sync": "all_reduce", "averaging": "all_reduce", "downpour": "round_trip", "easgd": "round_trip"}
EASGD_PERIOD = 4  # its default: steps between a trainer's exchanges
LIMITS = {"sync_ddp": 1.0, "sync_ddp_paired": 1.0, "sync_wait": 1.15, "downpour_update": 1.3, "alone_hand": 1.03,
          "steady": 1.0, "two_hosts": 1.6, "planned": 1.6}
AT_LEAST = ("two_hosts", "planned")  # goals met at or above their limit (the others at or below)
PORT = 29620  # the hand loops' and the raw exchanges' rendezvous: a fresh one each run (TIME_WAIT)


def exchanges(variant: str, steps: int) -> int:
    """Exchanges a trainer makes in an epoch of `steps` steps, with the algorithm's defaults."""
    return {"sync": steps, "averaging": 1, "downpour": steps, "easgd": math.ceil(steps / EASGD_PERIOD)}[variant]


def step_figures(history: History) -> dict:
    """Seconds a step and its split, each the median over the epochs after the first; the server's report."""
    epochs = history.latest_epochs()
    measured = epochs[1:] if len(epochs) > 1 else epochs
    steps = [max(round(worker.seconds * worker.steps_per_second) for worker in epoch.workers) for epoch in measured]
    figures = {"steps": max(steps), "epoch_seconds": [epoch.seconds for epoch in epochs],
               "step": median([epoch.seconds / count for epoch, count in zip(measured, steps)])}
    for part in ("compute", "communication", "data"):
        figures[part] = median([getattr(epoch.seconds_split, part) / count for epoch, count in zip(measured, steps)])
    figures["other"] = figures["step"] - figures["compute"] - figures["communication"] - figures["data"]
    figures["algorithm"] = [epoch.algorithm for epoch in epochs if epoch.algorithm]
    return figures


def hand_figures(result: dict, args: argparse.Namespace) -> dict:
    """A hand loop's seconds a step: its epochs after the first over their steps (each rank's rows / batch)."""
    if "error" in result:
        return result
    steps = math.ceil(args.rows / args.batch_size)
    seconds = result["epoch_seconds"]
    return {"steps": steps, "epoch_seconds": seconds, "step": median(seconds[1:] or seconds) / steps}


def wire_run(cluster: EmulatedCluster, models: list[str], args: argparse.Namespace, name: str, port: int) -> dict:
    """benchmarks/step_cost_wire.py on both hosts: per model, the median all-reduce and round trip (rank 1's), and
    every operation's seconds (`KIND_operations`)."""
    numbers = [parameters(model) for model in models]
    outputs = [cluster.shared / f"{name}-rank{host}.json" for host in range(comm.WORKERS)]
    logs = [cluster.shared / f"{name}-host{host}.log" for host in range(comm.WORKERS)]
    launchers = [cluster.start(host, [sys.executable, "-m", "benchmarks.step_cost_wire", "--rank", str(host),
                                      "--address", cluster.address(0), "--port", str(port), "--interface", "eth0",
                                      "--numbers", ",".join(map(str, numbers)), "--repeats", str(args.repeats),
                                      "--out", str(outputs[host])],
                               env=comm.environment(OMP_NUM_THREADS="1"), log=logs[host])
                 for host in range(comm.WORKERS)]
    codes = comm.wait(cluster, launchers)
    if any(code != 0 for code in codes) or not outputs[1].exists():
        comm.keep_logs(logs)
        return {model: {"error": comm.failure(codes, logs)} for model in models}
    sizes = json.loads(outputs[1].read_text())["sizes"]
    return {model: {**{kind: median(sizes[str(count)][kind]) for kind in RAW_KINDS},
                    **{f"{kind}_operations": sizes[str(count)][kind] for kind in RAW_KINDS}}
            for model, count in zip(models, numbers)}


def run_variant(cluster: EmulatedCluster, variant: str, model: str, data: dict[str, Path], args: argparse.Namespace,
                name: str, port: int) -> dict:
    """One run of one variant (not the raw exchanges, which wire_run measures for every model at once)."""
    if variant == "hand":
        alone = {"train": data["floor"], "test": data["test"]}
        return hand_figures(comm.ddp_run(cluster, "none", model, alone, args, name, port, hosts=1), args)
    if variant == "ddp":
        return hand_figures(comm.ddp_run(cluster, "plain", model, data, args, name, port), args)
    rows = data["train"] if variant in ("sync", "averaging") else data["floor"]
    algorithm = "sync" if variant == "alone" else variant
    job = comm.write_job(cluster.shared, name, model, rows, data["test"], args, algorithm_name=algorithm)
    return comm.shoal_run(cluster, job, name, hosts=1 if variant == "alone" else comm.WORKERS, figures=step_figures)


def run_round(cluster: EmulatedCluster, number: int, data: dict[str, Path], args: argparse.Namespace,
              runs: dict, began: float) -> None:
    """Every chosen variant of every chosen model once, the order rotated by the round's number; appended to
    runs[model][variant]."""
    port = PORT + 100 * number
    if "wire" in args.variants:
        wired = wire_run(cluster, args.models, args, f"wire-{number}", port)
        for model in args.models:
            for kind, value in wired[model].items():
                kept = runs[model].setdefault("wire_errors" if kind == "error" else kind, [])
                if kind.endswith("_operations"):
                    kept.extend(value)
                else:
                    kept.append(value)
            said = {kind: f"{1000 * wired[model][kind]:.2f} ms" for kind in RAW_KINDS if kind in wired[model]}
            print(f"round {number + 1} {model} raw: {said or wired[model]}", flush=True)
    if "plan" in args.variants and number == 0:  # what the plan says does not change between rounds
        for model in args.models:
            runs[model]["plan"] = plan_run(cluster, model, data, args, f"{model}-plan", ALGORITHMS)
            print(f"{model} plan: {runs[model]['plan']}", flush=True)
    order = [variant for variant in args.variants if variant not in ("wire", "plan")]
    shift = number % len(order) if order else 0
    for model in args.models:
        for variant in order[shift:] + order[:shift]:
            port += 1
            row = run_variant(cluster, variant, model, data, args, f"{model}-{variant}-{number}", port)
            runs[model].setdefault(variant, []).append(row)
            said = f"failed: {row['error']}" if "error" in row else f"{1000 * row['step']:.2f} ms a step"
            print(f"round {number + 1} {model} {variant}: {said} ({time.monotonic() - began:.0f} s)", flush=True)


def steps_of(rows: list) -> list[float]:
    return [row["step"] for row in rows if isinstance(row, dict) and "step" in row]


def middle(values: list[float]) -> float | None:
    return median(values) if values else None


def spread(values: list[float]) -> float | None:
    return (max(values) - min(values)) / median(values) if len(values) > 1 and median(values) > 0 else None


def summary(model: str, runs: dict, args: argparse.Namespace) -> dict:
    """Per variant of one model: the runs' seconds a step, their median and spread, and shoal's split (medians)."""
    found = {}
    for kind in RAW_KINDS:
        values = runs.get(kind, [])
        if values or runs.get("wire_errors"):
            found[kind] = {"runs": values, "step": middle(values), "spread": spread(values),
                           "errors": runs.get("wire_errors", []), "operations": runs.get(f"{kind}_operations", [])}
    for variant in args.variants:
        rows = runs.get(variant, [])
        values = steps_of(rows)
        if variant in ("wire", "plan") or not rows:
            continue
        entry = {"runs": values, "step": middle(values), "spread": spread(values) if values else None,
                 "errors": [row["error"] for row in rows if "error" in row]}
        if variant in ALGORITHMS or variant == "alone":
            good = [row for row in rows if "step" in row]
            for part in ("compute", "communication", "data", "other"):
                entry[part] = middle([row[part] for row in good])
            entry["steps"] = max((row["steps"] for row in good), default=None)
        found[variant] = entry
    found["paired"] = paired(runs.get("sync", []), runs.get("ddp", []))
    found["plan"] = runs.get("plan")
    return found


def paired(sync: list, ddp: list) -> list[float]:
    """sync's step over DDP's in each round where both ran: the two ran minutes apart at most, so a slow spell of
    the machine weighs on both."""
    return [mine["step"] / theirs["step"] for mine, theirs in zip(sync, ddp)
            if "step" in mine and "step" in theirs and theirs["step"] > 0]


def over_one_host(found: dict, variant: str) -> float | None:
    """How many times faster than one host training the same rows: both hosts train in sync and averaging (one host
    alone takes two of its steps for one of theirs), one trainer beside the server in Downpour and EASGD."""
    alone, step = found.get("alone", {}).get("step"), found.get(variant, {}).get("step")
    if not alone or not step:
        return None
    return (1 if variant in SERVED else comm.WORKERS) * alone / step


def wait_per_exchange(variant: str, entry: dict) -> float | None:
    if variant not in RAW_OF or entry.get("communication") is None or not entry.get("steps"):
        return None
    return entry["communication"] * entry["steps"] / exchanges(variant, entry["steps"])


def ratio_of(found: dict, top: str, bottom: str, part: str = "step") -> float | None:
    high, low = found.get(top, {}).get(part), found.get(bottom, {}).get("step")
    return high / low if high is not None and low else None


def goals(found: dict) -> list[dict]:
    """The issue's goals for one model: the measured ratio, its limit, and met (None: not measured)."""
    waited = wait_per_exchange("sync", found.get("sync", {}))
    raw, trip = found.get("all_reduce", {}).get("step"), found.get("round_trip", {}).get("step")
    update = wait_per_exchange("downpour", found.get("downpour", {}))
    sync_spread, ddp_spread = found.get("sync", {}).get("spread"), found.get("ddp", {}).get("spread")
    measured_speedups = {variant: over_one_host(found, variant) for variant in ALGORITHMS}
    chosen, right = planned_goal(found.get("plan"), {variant: value for variant, value in measured_speedups.items()
                                                     if value}, LIMITS["planned"])
    measured = {"sync_ddp": ratio_of(found, "sync", "ddp"),
                "sync_ddp_paired": middle(found.get("paired", [])),
                "sync_wait": waited / raw if waited is not None and raw else None,
                "downpour_update": update / trip if update is not None and trip else None,
                "alone_hand": ratio_of(found, "alone", "hand"),
                "steady": sync_spread / ddp_spread if sync_spread is not None and ddp_spread else None,
                "two_hosts": max(filter(None, measured_speedups.values()), default=None),
                "planned": chosen}
    texts = {"sync_ddp": "sync's step no slower than DDP's", "sync_ddp_paired": "the same, as the median of each "
             "round's sync over DDP", "sync_wait": "sync's exchange wait a step within 1.15x "
             "of the raw all-reduce", "downpour_update": "Downpour's update within 1.3x of the raw round trip",
             "alone_hand": "one worker's loop within 1.03x of the hand loop",
             "steady": "sync's spread between runs no wider than DDP's (spread over spread)",
             "two_hosts": "the fastest algorithm's speed-up on 2 hosts over one host on the same rows",
             "planned": f"the measured speed-up of what `shoal plan` recommends ({plan_choice(found)}; one machine is "
                        "right where no algorithm measured 1.2x)"}
    judged = {"planned": right}  # the plan's "one machine" is met below the limit, not above it
    return [{"goal": key, "text": texts[key], "ratio": value, "limit": LIMITS[key], "at_least": key in AT_LEAST,
             "met": judged[key] if key in judged else None if value is None else
             (value >= LIMITS[key] if key in AT_LEAST else value <= LIMITS[key])}
            for key, value in measured.items()]


def plan_choice(found: dict) -> str:
    plan = found.get("plan") or {}
    if "error" in plan:
        return f"the plan failed: {plan['error']}"
    return plan.get("choice") or ("withheld: " + str(plan.get("withheld")) if plan else "not run")


def milliseconds(value: float | None) -> str:
    return "—" if value is None else f"{1000 * value:.2f}"


def times(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def share(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def table(found: dict) -> str:
    lines = ["| variant | ms a step | runs (ms) | spread | x hand loop | x DDP | compute | communication | data | "
             "other | wait per exchange (ms) | x raw | x one host |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for variant in ("hand", "alone", "ddp", "all_reduce", "round_trip", *ALGORITHMS):
        if variant not in found:
            continue
        entry = found[variant]
        runs, errors = ", ".join(f"{1000 * value:.1f}" for value in entry["runs"]), entry.get("errors", [])
        if errors:
            runs += f"; {len(errors)} failed: {errors[0]}"
        runs += operations(entry.get("operations", []))
        waited, raw = wait_per_exchange(variant, entry), found.get(RAW_OF.get(variant, ""), {}).get("step")
        raw_row = variant in ("all_reduce", "round_trip")
        hand, ddp = ("—", "—") if raw_row else (times(ratio_of(found, variant, "hand")),
                                                 times(ratio_of(found, variant, "ddp")))
        lines.append(f"| {LABELS[variant]} | {milliseconds(entry['step'])} | {runs.replace('|', '/')} | "
                     f"{share(entry['spread'])} | {hand} | {ddp} | "
                     f"{milliseconds(entry.get('compute'))} | {milliseconds(entry.get('communication'))} | "
                     f"{milliseconds(entry.get('data'))} | {milliseconds(entry.get('other'))} | "
                     f"{milliseconds(waited)} | {times(waited / raw if waited is not None and raw else None)} | "
                     f"{times(over_one_host(found, variant)) if variant in ALGORITHMS else '—'} |")
    return "\n".join(lines)


def plan_lines(found: dict) -> str:
    """The plan's recommendation and its 2-host step for each algorithm beside the measured one."""
    plan = found.get("plan")
    if not plan or "error" in plan:
        return f"`shoal plan`: {plan_choice(found)}\n\n" if plan else ""
    cells = []
    for variant in ALGORITHMS:
        predicted, measured = plan["steps"].get(variant), found.get(variant, {}).get("step")
        error = f", {predicted / measured - 1:+.0%}" if predicted and measured else ""
        cells.append(f"{variant} {milliseconds(predicted)} ms (measured {milliseconds(measured)}{error})")
    said = plan["recommendation"] or f"none ({plan['withheld']})"
    return f"`shoal plan` on host0: recommended {said}. Its 2-host step: {'; '.join(cells)}.\n\n"


def operations(seconds: list[float]) -> str:
    """A raw exchange's single operations over every round: their least, quartiles and most (ms)."""
    if len(seconds) < 4:
        return ""
    low, middle_value, high = statistics.quantiles(seconds, n=4)
    shown = ", ".join(f"{1000 * value:.1f}" for value in (min(seconds), low, middle_value, high, max(seconds)))
    return f" ({len(seconds)} operations: least, quartiles, most {shown})"


def goals_list(found: list[dict]) -> str:
    marks = {True: "met", False: "**missed**", None: "not measured"}
    return "\n".join(f"- {goal['text']}: {times(goal['ratio'])} ({'at least' if goal.get('at_least') else 'limit'} "
                     f"{goal['limit']:g}x): {marks[goal['met']]}" for goal in found)


def noise(sections: list[dict]) -> str:
    spreads = [entry["spread"] for section in sections for entry in section["variants"].values()
               if isinstance(entry, dict) and entry.get("spread") is not None]
    if not spreads:
        return "One run of each: no spread."
    return (f"Spread of the runs (max - min over the median), over every variant and model: median "
            f"{share(median(spreads))}, largest {share(max(spreads))}.")


def report(sections: list[dict], args: argparse.Namespace, seconds: float, argv: list[str]) -> str:
    command = " ".join(["python -m benchmarks.step_cost", *argv])
    parts = [f"""# What a step costs: shoal's algorithms against hand loops and the raw exchange

{machine_line()}. The emulated cluster: 2 hosts, each its own core, one worker and 1 thread per host, a
{args.link} link shaped with `tc tbf`. Synthetic digits, {args.rows:,} rows per trainer, batch
{args.batch_size}, SGD lr {args.lr:g} momentum {args.momentum:g}, {args.epochs} epochs a run; a run's seconds
a step are the median of its epochs after the first, each over its steps. {args.runs} interleaved round(s);
every figure is the median over them, "spread" is (max - min) / median. shoal's split (compute,
communication, data, and "other", what it leaves out) is its epoch_end events' mean over the trainers.
"Wait per exchange": communication a step x steps / exchanges an epoch (sync and downpour: every step;
averaging: one an epoch; easgd: every {EASGD_PERIOD} steps), against the raw all-reduce (sync, averaging) or
round trip (downpour, easgd) of the model's fp32 gradients, {args.repeats} timed operations a round.
Downpour and EASGD (asynchronous, their default) serve from rank 0 on host0 and train on host1.
`{command}` ({seconds / 60:.1f} minutes).
"""]
    for section in sections:
        model = section["model"]
        parts.append(f"""## {model}: {MODELS[model]['what']}, {parameters(model):,} parameters \
({step_bytes(model, 'none'):,} gradient bytes)

{table(section['variants'])}

{plan_lines(section['variants'])}{goals_list(section['goals'])}
""")
    parts.append(f"## Noise\n\n{noise(sections)}\n")
    return "\n".join(parts)


def sections_of(runs: dict, args: argparse.Namespace) -> list[dict]:
    sections = []
    for model in args.models:
        found = summary(model, runs[model], args)
        sections.append({"model": model, "variants": found, "goals": goals(found)})
    return sections


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODEL_NAMES), help=f"some of {', '.join(MODEL_NAMES)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"some of {', '.join(VARIANTS)} (wire: the raw "
                        "all-reduce and round trip)")
    parser.add_argument("--link", default="1gbit", help="the link's rate in tc's spelling")
    parser.add_argument("--runs", type=int, help="interleaved rounds; default 3 (--quick: 1)")
    parser.add_argument("--epochs", type=int, help="a run's epochs, the first left out; default 3 (--quick: 2)")
    parser.add_argument("--rows", type=int, help="training rows per trainer; default 2560 (--quick: 256)")
    parser.add_argument("--test-rows", type=int, help="default 256")
    parser.add_argument("--repeats", type=int, help="timed raw operations of each kind a round; default 10 "
                        "(--quick: 3)")
    parser.add_argument("--batch-size", type=int, default=128, help="rows per step on each trainer")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny data, one round")
    args = parser.parse_args(argv)
    quick = {"runs": 1, "epochs": 2, "rows": 256, "test_rows": 256, "repeats": 3}
    full = {"runs": 3, "epochs": 3, "rows": 2560, "test_rows": 256, "repeats": 10}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.models = comm.choices(args.models, MODEL_NAMES, "--models")
    args.variants = [variant for variant in VARIANTS if variant in comm.choices(args.variants, VARIANTS, "--variants")]
    try:
        parse_rate(args.link, "--link")
    except ConfigError as error:
        raise SystemExit(f"benchmarks.step_cost: {error}") from None
    args.rank = 4  # comm's jobs read it for PowerSGD, which no run here uses
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    reason = missing_requirements(comm.WORKERS)
    if reason:
        sys.exit(f"benchmarks.step_cost: {reason}")
    began = time.monotonic()
    data = comm.prepare_data(args)
    runs, path = {model: {} for model in args.models}, None
    with EmulatedCluster(hosts=comm.WORKERS, rate=args.link) as cluster:
        for number in range(args.runs):
            run_round(cluster, number, data, args, runs, began)
            sections = sections_of(runs, args)
            markdown = report(sections, args, time.monotonic() - began, argv)
            record = {"machine": machine(), "arguments": vars(args), "runs": runs, "sections": sections}
            path = write_result("step-cost-quick" if args.quick else "step-cost", markdown, record, replacing=path)
    print(markdown)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
