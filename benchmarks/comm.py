"""Synchronous SGD at the wire's speed: shoal's `sync` with each compression against DDP and the compute floor.

On the emulated cluster (tests/cluster/hosts.py: 2 network namespaces, each host its own core, a tbf-shaped
link with a small bucket) two models of benchmarks/comm_models.py, a 784-2048-512-10 MLP (2.66M parameters,
10.6 MB of fp32 gradients) and a small CNN (18k parameters), train synthetic digits (shoal.data.synthetic:
`--rows` rows per host, a separate test set), batch 128 per worker, SGD with momentum, over each link. Per
(model, link), every run with the same rows per worker, batch and epochs:

- floor: one worker alone on one host (host0) with one host's rows: the compute no exchange can beat
  (measured once per model, on the first link's cluster);
- shoal `sync` with `algorithm.compression` none, bf16, fp16 and powersgd (`compression_rank` = `--rank`),
  one worker per host;
- DDP over gloo on the same hosts (benchmarks/comm_ddp.py): plain, with torch's fp16_compress_hook, and with
  its PowerSGD hook at the same rank (its error is recorded if it fails, as it does over gloo in torch 2.13).

Reported per run: seconds per epoch (the median of the epochs after the first), shoal's communication
seconds per epoch (its epoch_end time split: the exchange the backward pass did not hide), the seconds the
link needs for the run's bytes (steps x bytes a step x 2(N-1)/N / rate) and the test accuracy after the
last epoch; beside them the issue's goals: exact sync within 1.15x of max(floor, wire) at 1 Gbit/s and
never slower than DDP; powersgd within 1.3x of the floor at 1 Gbit/s and 2x at 100 Mbit/s, within a point
of exact sync's accuracy; bf16 and fp16 at least as fast as DDP's fp16 hook. A run that fails is recorded
with its error and the others go on. Results are written as they come (benchmarks/results/*-comm.md and
.json). Needs root, `ip` and `tc`, and 2 cores that nothing else uses.

    .venv/bin/python -m benchmarks.comm            # about 20-30 minutes on 2 quiet cores
    .venv/bin/python -m benchmarks.comm --quick    # a smoke run of every path: tiny data, 1 epoch
    .venv/bin/python -m benchmarks.comm --models mlp --links 1gbit --runs floor,none,powersgd,ddp
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import tomli_w
from tests.cluster.hosts import EmulatedCluster, missing_requirements
from tests.cluster.jobs import start_on_hosts

from benchmarks.comm_models import COMM_MODELS, COMPRESSIONS, MODELS, parameters, step_bytes, wire_seconds
from benchmarks.common import ROOT, WORK, epoch_seconds, machine, machine_line, median, write_result
from shoal.data.synthetic import synth_digits
from shoal.errors import ConfigError
from shoal.events import History, read_history
from shoal.plan.calibrate import parse_rate, reached_share

LINKS = ("1gbit", "100mbit")
DDP_HOOKS = {"ddp": "plain", "ddp-fp16": "fp16", "ddp-powersgd": "powersgd"}
OVERLAPPED = "none-overlap"  # exact sync with overlap forced on (its "auto" leaves it off on a one-core host)
RUNS = ("floor", *COMPRESSIONS, OVERLAPPED, *DDP_HOOKS)
LABELS = {"floor": "one host alone (compute floor)", "none": "shoal sync",
          OVERLAPPED: "shoal sync, overlap = true", "bf16": "shoal sync, bf16",
          "fp16": "shoal sync, fp16", "powersgd": "shoal sync, powersgd", "ddp": "DDP (gloo)",
          "ddp-fp16": "DDP + fp16_compress_hook", "ddp-powersgd": "DDP + PowerSGD hook"}
WIRE_OF = {"none": "none", OVERLAPPED: "none", "bf16": "bf16", "fp16": "fp16", "powersgd": "powersgd", "ddp": "none",
           "ddp-fp16": "fp16"}  # the bytes each run's exchange moves; torch's PowerSGD buckets its own way
WORKERS = 2
RUN_SECONDS = 1800  # the longest a run may take (the MLP's exact exchange at 100 Mbit/s: about 40 s an epoch)
GRACE_SECONDS = 15  # after one host's failure, how long the other has to end before it is killed
DDP_PORT = 29520
# The goals by link rate (bits per second); a link not named here gets its figures without a verdict.
EXACT_LIMIT = {1e9: 1.15}
POWERSGD_LIMIT = {1e9: 1.3, 1e8: 2.0}
ACCURACY_POINTS = 1.0


def prepare_data(args: argparse.Namespace) -> dict[str, Path]:
    """Both hosts' rows, one host's rows (the floor) and the test set, made once in benchmarks/work/comm."""
    folder = WORK / "comm"
    data = {"train": (folder / f"digits-{WORKERS * args.rows}", WORKERS * args.rows, 1),
            "floor": (folder / f"digits-{args.rows}", args.rows, 1),
            "test": (folder / f"digits-test-{args.test_rows}", args.test_rows, 2)}
    for path, rows, seed in data.values():
        if not path.exists():
            synth_digits(str(path), rows, seed=seed)
    return {name: path for name, (path, _, _) in data.items()}


def write_job(folder: Path, name: str, model: str, train: Path, test: Path, args: argparse.Namespace,
              compression: str = "none", algorithm_name: str = "sync") -> Path:
    """The job of one run: `algorithm_name` with its defaults (sync: with `compression`)."""
    algorithm = {"name": algorithm_name}
    if compression == OVERLAPPED:
        algorithm["overlap"], compression = True, "none"
    if compression != "none":  # none is the default: the job runs on a shoal without the option too
        algorithm["compression"] = compression
        if compression == "powersgd":
            algorithm["compression_rank"] = args.rank
    job = {"model": {"input": MODELS[model]["input"], "layers": MODELS[model]["layers"]},
           "data": {"train": str(train), "test": str(test)},
           "algorithm": algorithm,
           "train": {"epochs": args.epochs, "batch_size": args.batch_size, "eval_every": args.epochs,
                     "optimizer": {"name": "sgd", "lr": args.lr, "momentum": args.momentum}},
           "cluster": {"threads": 1, "timeout": 600}}
    path = folder / f"{name}.toml"
    path.write_text(tomli_w.dumps(job) + '\n[checkpoint]\nevery = 0\n\n[output]\nprogress = "none"\n')
    return path


def environment(**more: str) -> dict:
    return dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}", **more)


def wait(cluster: EmulatedCluster, launchers: list) -> list[int | None]:
    """Every launcher's exit status once all have ended; after a failure the others get GRACE_SECONDS to
    end (a rank left in a collective would wait out its timeout), and none runs past RUN_SECONDS."""
    deadline, failed = time.monotonic() + RUN_SECONDS, None
    while any(launcher.poll() is None for launcher in launchers):
        now = time.monotonic()
        if failed is None and any(launcher.poll() not in (None, 0) for launcher in launchers):
            failed = now
        if now > deadline or (failed is not None and now - failed > GRACE_SECONDS):
            break
        time.sleep(0.2)
    codes = [launcher.poll() for launcher in launchers]
    cluster.stop_processes()  # nothing of this run may slow the next
    return codes


def keep_logs(logs: list[Path]) -> None:
    """A failed run's logs, copied out of the cluster's folder (removed with it) into benchmarks/work/comm/logs."""
    folder = WORK / "comm" / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    for log in logs:
        if log.exists():
            shutil.copyfile(log, folder / log.name)


def failure(codes: list[int | None], logs: list[Path]) -> str:
    """One line: which host failed and the last line it wrote."""
    for host, (code, log) in enumerate(zip(codes, logs)):
        if code is None:
            return f"host{host} still ran after {RUN_SECONDS} s"
        if code != 0:
            return f"host{host} exit status {code}: {last_line(log)}"
    return "?"


def last_line(log: Path) -> str:
    lines = [line.strip() for line in (log.read_text(errors="replace") if log.exists() else "").splitlines()
             if line.strip()]
    return lines[-1] if lines else "no output"


def shoal_figures(history: History) -> dict:
    epochs = history.latest_epochs()
    communication = [epoch.seconds_split.communication for epoch in epochs]
    end = history.end
    return {"epoch_seconds": [epoch.seconds for epoch in epochs], "seconds": median(epoch_seconds(history)),
            "communication_per_epoch": communication,
            "communication": median(communication[1:] if len(communication) > 1 else communication),
            "accuracy": (end.test or {}).get("accuracy") if end else None,
            "train_loss": [epoch.train_loss for epoch in epochs]}


def shoal_run(cluster: EmulatedCluster, job: Path, name: str, hosts: int, figures=shoal_figures) -> dict:
    """`shoal train` on one host alone (the floor) or on both, as the README's Many machines section says; what
    `figures` makes of its events."""
    run_dir = cluster.shared / name
    launchers = start_on_hosts(cluster, str(job), run_dir, environment(), hosts)
    codes = wait(cluster, launchers)
    if any(code != 0 for code in codes):
        logs = [cluster.shared / f"{name}-host{host}.log" for host in range(hosts)]
        keep_logs(logs)
        return {"error": failure(codes, logs)}
    return figures(read_history(run_dir))


def ddp_run(cluster: EmulatedCluster, hook: str, model: str, data: dict[str, Path], args: argparse.Namespace,
            name: str, port: int, hosts: int = WORKERS) -> dict:
    """benchmarks/comm_ddp.py on the first `hosts` hosts; rank 0's timings and accuracy, or the first error a
    rank wrote."""
    outputs = [cluster.shared / f"{name}-rank{host}.json" for host in range(hosts)]
    logs = [cluster.shared / f"{name}-host{host}.log" for host in range(hosts)]
    launchers = []
    for host in range(hosts):
        command = [sys.executable, "-m", "benchmarks.comm_ddp", "--rank", str(host), "--world-size", str(hosts),
                   "--address", cluster.address(0), "--port", str(port), "--interface", "eth0", "--model", model,
                   "--train", str(data["train"]), "--test", str(data["test"]), "--epochs", str(args.epochs),
                   "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--momentum", str(args.momentum),
                   "--hook", hook, "--powersgd-rank", str(args.rank), "--out", str(outputs[host])]
        launchers.append(cluster.start(host, command, env=environment(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"),
                                       log=logs[host]))
    codes = wait(cluster, launchers)
    # Oldest first: the rank that failed first wrote first; the other's error is mostly the lost connection.
    written = [json.loads(output.read_text()) for output in sorted((output for output in outputs if output.exists()),
                                                                   key=lambda output: output.stat().st_mtime_ns)]
    errors = [f"rank {result['rank']}: {innermost(result['error'])}" for result in written if "error" in result]
    # A rank that died without writing its error (an abort inside gloo) is where the failure began.
    told = {result["rank"] for result in written if "error" in result}
    died = [f"rank {rank} exit status {code}: {last_line(logs[rank])}" for rank, code in enumerate(codes)
            if code not in (0, None) and rank not in told]
    if errors or died or any(code != 0 for code in codes):
        keep_logs(logs)
        errors = died + errors
        return {"error": errors[0] if errors else failure(codes, logs), "errors": errors}
    first = next(result for result in written if result["rank"] == 0)
    seconds = first["epoch_seconds"]
    return {"epoch_seconds": seconds, "seconds": median(seconds[1:] if len(seconds) > 1 else seconds),
            "communication": None, "accuracy": first["accuracy"], "train_loss": first["train_loss"]}


def innermost(error: str, limit: int = 300) -> str:
    """torch's future errors nest as "Got the following error when running the callback: ...": the last one."""
    return error.split("when running the callback: ")[-1][:limit]


def wire(model: str, run: str, args: argparse.Namespace, rate: float) -> float | None:
    if run not in WIRE_OF:
        return None
    steps = math.ceil(args.rows / args.batch_size)
    return wire_seconds(step_bytes(model, WIRE_OF[run], args.rank), steps, WORKERS, rate)


def seconds_of(results: dict, run: str) -> float | None:
    return results.get(run, {}).get("seconds")


def verdict(measured: float | None, limit: float | None) -> bool | None:
    return None if measured is None or limit is None else measured <= limit


def goals(model: str, rate: float, results: dict, args: argparse.Namespace) -> list[dict]:
    """The issue's goals for one (model, link): each with its figures, and met (True/False) where the goal
    applies to this link and both sides were measured (else None)."""
    floor, none = seconds_of(results, "floor"), seconds_of(results, "none")
    found = []
    exact_wire = wire(model, "none", args, rate)
    bound = max(floor, exact_wire) if floor is not None else None
    limit = EXACT_LIMIT.get(rate)
    found.append({"goal": f"exact sync within {limit:g}x of max(floor, wire)" if limit else
                  "exact sync against max(floor, wire) (no goal at this rate)",
                  "figures": f"{figure(none)} s against max({figure(floor)}, {figure(exact_wire)}) = {figure(bound)} s "
                             f"({ratio(none, bound)}); the wire at the share of the rate gloo reaches here "
                             f"({reached_share(rate):.0%}, shoal.plan.calibrate): "
                             f"{figure(exact_wire / reached_share(rate))} s",
                  "met": verdict(none, limit * bound if limit and bound else None)})
    found.append({"goal": "exact sync no slower than DDP",
                  "figures": f"{figure(none)} s against {figure(seconds_of(results, 'ddp'))} s",
                  "met": verdict(none, seconds_of(results, "ddp"))})
    powersgd, limit = seconds_of(results, "powersgd"), POWERSGD_LIMIT.get(rate)
    found.append({"goal": f"powersgd within {limit:g}x of the floor" if limit else
                  "powersgd against the floor (no goal at this rate)",
                  "figures": f"{figure(powersgd)} s against {figure(floor)} s ({ratio(powersgd, floor)})",
                  "met": verdict(powersgd, limit * floor if limit and floor is not None else None)})
    exact_accuracy, powersgd_accuracy = (results.get(run, {}).get("accuracy") for run in ("none", "powersgd"))
    gap = None if exact_accuracy is None or powersgd_accuracy is None else 100 * (exact_accuracy - powersgd_accuracy)
    found.append({"goal": f"powersgd's accuracy within {ACCURACY_POINTS:g} point of exact sync's",
                  "figures": f"{percent(powersgd_accuracy)} against {percent(exact_accuracy)}",
                  "met": None if gap is None else gap <= ACCURACY_POINTS})
    hooked = seconds_of(results, "ddp-fp16")
    for run in ("bf16", "fp16"):
        found.append({"goal": f"{run} no slower than DDP's fp16 hook",
                      "figures": f"{figure(seconds_of(results, run))} s against {figure(hooked)} s",
                      "met": verdict(seconds_of(results, run), hooked)})
    return found


def figure(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}%"


def ratio(value: float | None, base: float | None) -> str:
    return "—" if value is None or not base else f"{value / base:.2f}x"


def table(model: str, rate: float, results: dict, args: argparse.Namespace) -> str:
    lines = ["| run | s/epoch | communication s/epoch | wire s/epoch | x floor | test accuracy | note |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    floor = seconds_of(results, "floor")
    for run in RUNS:
        if run not in results:
            continue
        row = results[run]
        lines.append(f"| {LABELS[run]} | {figure(row.get('seconds'))} | {figure(row.get('communication'))} | "
                     f"{figure(wire(model, run, args, rate))} | {ratio(row.get('seconds'), floor)} | "
                     f"{percent(row.get('accuracy'))} | {row.get('error', '').replace('|', '/')} |")
    return "\n".join(lines)


def goals_list(found: list[dict]) -> str:
    marks = {True: "met", False: "**not met**", None: "no verdict"}
    return "\n".join(f"- {goal['goal']}: {goal['figures']}: {marks[goal['met']]}" for goal in found)


def report(sections: list[dict], args: argparse.Namespace, seconds: float, argv: list[str]) -> str:
    command = " ".join(["python -m benchmarks.comm", *argv])
    parts = [f"""# Synchronous SGD at the wire's speed: shoal's compressions against DDP

{machine_line()}. The emulated cluster: 2 hosts, each its own core, one worker and 1 thread per host,
links shaped with `tc tbf` (a small bucket, no added latency). Synthetic digits, {args.rows:,} rows per
host ({args.test_rows:,} test rows), batch {args.batch_size} per worker, SGD lr {args.lr:g} momentum
{args.momentum:g}, {args.epochs} epoch(s); seconds per epoch are the median of the epochs after the first,
evaluation excluded; accuracy after the last epoch. "Wire": steps x bytes a step x 2(N-1)/N / rate, the
link's time for the run's exchange. "Communication": shoal's epoch_end split, the exchange the backward
pass did not hide. The floor is one worker alone on host0 with one host's rows. PowerSGD at rank
{args.rank}. `{command}` ({seconds / 60:.1f} minutes).
"""]
    for section in sections:
        model = section["model"]
        parts.append(f"""## {model} at {section['link']}: {MODELS[model]['what']}, {parameters(model):,} parameters

{table(model, section['rate'], section['results'], args)}

{goals_list(section['goals'])}
""")
    return "\n".join(parts)


def run_link(link: str, data: dict[str, Path], args: argparse.Namespace, floors: dict, port: int) -> list[dict]:
    """Every chosen run of every chosen model on one emulated cluster at `link`; the floors measured once."""
    sections = []
    with EmulatedCluster(hosts=WORKERS, rate=link) as cluster:
        for model in args.models:
            results = {}
            for run in args.runs:
                name = f"{model}-{link}-{run}"
                if run == "floor":
                    if model not in floors:
                        job = write_job(cluster.shared, name, model, data["floor"], data["test"], args)
                        floors[model] = shoal_run(cluster, job, name, hosts=1)
                    results[run] = floors[model]
                elif run in DDP_HOOKS:
                    port += 1  # a fresh port: the last run's may still be in TIME_WAIT
                    results[run] = ddp_run(cluster, DDP_HOOKS[run], model, data, args, name, port)
                else:
                    job = write_job(cluster.shared, name, model, data["train"], data["test"], args, run)
                    results[run] = shoal_run(cluster, job, name, hosts=WORKERS)
                row = results[run]
                print(f"{name}: " + (f"failed: {row['error']}" if "error" in row else
                                     f"{figure(row['seconds'])} s/epoch, communication {figure(row['communication'])}, "
                                     f"accuracy {percent(row['accuracy'])}"), flush=True)
            rate = parse_rate(link)
            sections.append({"model": model, "link": link, "rate": rate, "results": results,
                             "goals": goals(model, rate, results, args)})
    return sections


def choices(text: str, allowed, option: str) -> list[str]:
    chosen = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in chosen if item not in allowed]
    if unknown or not chosen:
        raise SystemExit(f"benchmarks.comm: {option}: {', '.join(unknown) or 'nothing'} not among "
                         f"{', '.join(allowed)}")
    return chosen


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(COMM_MODELS), help=f"some of {', '.join(MODELS)}")
    parser.add_argument("--links", default=",".join(LINKS), help="link rates in tc's spelling (1gbit, 100mbit)")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"some of {', '.join(RUNS)}")
    parser.add_argument("--epochs", type=int, help="default 3 (--quick: 1)")
    parser.add_argument("--rows", type=int, help="training rows per host; default 6000 (--quick: 256)")
    parser.add_argument("--test-rows", type=int, help="default 2000 (--quick: 256)")
    parser.add_argument("--batch-size", type=int, default=128, help="rows per step on each worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--rank", type=int, default=4, help="PowerSGD's rank (shoal's and torch's)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny data, one epoch")
    args = parser.parse_args(argv)
    quick = {"epochs": 1, "rows": 256, "test_rows": 256}
    full = {"epochs": 3, "rows": 6000, "test_rows": 2000}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.models = choices(args.models, tuple(MODELS), "--models")
    args.runs = [run for run in RUNS if run in choices(args.runs, RUNS, "--runs")]
    args.links = [link.strip() for link in args.links.split(",") if link.strip()]
    for link in args.links:
        try:
            parse_rate(link, "--links")
        except ConfigError as error:
            raise SystemExit(f"benchmarks.comm: {error}") from None
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    reason = missing_requirements(WORKERS)
    if reason:
        sys.exit(f"benchmarks.comm: {reason}")
    began = time.monotonic()
    data = prepare_data(args)
    sections, floors, path = [], {}, None
    for number, link in enumerate(args.links):
        sections += run_link(link, data, args, floors, DDP_PORT + 100 * number)
        markdown = report(sections, args, time.monotonic() - began, argv)
        record = {"machine": machine(), "arguments": vars(args), "sections": sections}
        path = write_result("comm-quick" if args.quick else "comm", markdown, record, replacing=path)
    print(markdown)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
