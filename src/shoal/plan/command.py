"""`shoal plan`'s steps: read the options, calibrate (or reuse a profile), plan, render; the CLI stays thin."""

from __future__ import annotations

import sys

from shoal.cluster.env import cores
from shoal.config import JobConfig
from shoal.errors import ConfigError
from shoal.plan.calibrate import LOOPBACK, calibrate, described_network, model_key_of
from shoal.plan.machines import MachineClass, check_models, machine_counts, machine_speeds, parse_machines
from shoal.plan.median import median_profile
from shoal.plan.planner import COMPARED, Forecast, job_shape, make_plan
from shoal.plan.predict import is_server
from shoal.plan.profile import Profile, load_profile
from shoal.plan.render import plot, render

DEFAULT_NODES = (1, 2, 4, 8, 16)
KNOWN = ("sync", "averaging", "downpour", "easgd", "none")


def node_counts(text: str | None, hosts: list[str] | None) -> list[int]:
    if hosts:
        return list(range(1, len(hosts) + 1))
    if text is None:
        return list(DEFAULT_NODES)
    try:
        counts = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise ConfigError(f"--nodes: expected node counts like 1,2,4,8, got {text!r}") from None
    if not counts or counts[0] < 1:
        raise ConfigError(f"--nodes: node counts must be >= 1, got {text!r}")
    return counts


def planned_counts(text: str | None, hosts: list[str] | None, classes: list[MachineClass]) -> list[int]:
    """The node counts to plan: as `node_counts` says; on listed machines (`--machines`), none beyond them."""
    if not classes:
        return node_counts(text, hosts)
    total = sum(machine.count for machine in classes)
    if hosts and len(hosts) != total:
        raise ConfigError(f"--machines: lists {total} machine(s) for {len(hosts)} --hosts (one for each host, "
                          "in the same order)")
    if not hosts and text is None:
        return machine_counts(classes)
    counts = node_counts(text, hosts)
    if counts[-1] > total:
        raise ConfigError(f"--nodes: {counts[-1]} nodes, but --machines lists {total}")
    return counts


def algorithms(text: str | None, job: JobConfig) -> list[str]:
    names = list(dict.fromkeys([job.algorithm.name, *COMPARED])) if text is None else text.split(",")
    for name in names:
        if name not in KNOWN:
            raise ConfigError(f"--algorithms: unknown algorithm {name!r} (one of {', '.join(KNOWN)})")
    return names


def check_options(args) -> None:
    """The options a plan cannot start with, one line each, before any probe runs."""
    if args.workers_per_node < 1:
        raise ConfigError(f"--workers-per-node: must be >= 1, got {args.workers_per_node}")
    if args.latency is not None and args.link is None:
        raise ConfigError("--latency: only with --link (a described network)")
    if args.rows is not None and args.rows < 1:
        raise ConfigError(f"--rows: must be >= 1, got {args.rows}")
    for option, path in (("--save-profile", args.save_profile), ("--plot", args.plot)):
        if path is not None and not path.parent.is_dir():  # before minutes of probing, not after
            raise ConfigError(f"{option}: no folder {path.parent} to write {path.name} in")


def profile_for(job: JobConfig, args, hosts: list[str] | None, messages: bool = True) -> Profile:
    """The saved profile, completed by measurement, or with the network the options describe; `messages`: a
    parameter server is planned (its point-to-point messages are measured)."""
    threads = job.cluster.threads or max(1, cores() // args.workers_per_node)
    profile = median_profile([(path, load_profile(path)) for path in args.profile]) if args.profile else None
    described = None
    if args.link is not None:  # loopback stays as the profile measured it, and a measured link's latency
        known = profile.network if profile else None
        probed = known.across if known and known.across.measured else None
        described = described_network(args.link, args.latency, known.inside if known else LOOPBACK, probed)
    profile = calibrate(job, profile, threads=threads, hosts=hosts, described=described,
                        per_node=args.workers_per_node, messages=messages)
    if args.save_profile:
        profile.save(args.save_profile)
        print(f"shoal plan: profile saved to {args.save_profile}", file=sys.stderr)
    return profile


def plan_job(job: JobConfig, args) -> tuple[Forecast, str]:
    """Calibrate as the options say, then plan every node count and algorithm; (the plan, its text)."""
    check_options(args)
    hosts = [host.strip() for host in args.hosts.split(",")] if args.hosts else None
    classes = parse_machines(args.machines) if args.machines else []
    nodes = planned_counts(args.nodes, hosts, classes)
    names = algorithms(args.algorithms, job)
    shapes = [job_shape(job, args.rows, name) for name in names]
    if any(machine.compute is not None for machine in classes):
        check_models(classes, model_key_of(job))  # before minutes of probing, not after
    profile = profile_for(job, args, hosts, messages=any(is_server(shape) for shape in shapes))
    speeds = machine_speeds(classes, profile.compute, job.train.batch_size)
    plan = make_plan(shapes, nodes, args.workers_per_node, profile, speeds)
    if args.plot:
        print(f"shoal plan: curves in {plot(plan, args.plot)}", file=sys.stderr)
    return plan, render(plan, profile, args.workers_per_node)
