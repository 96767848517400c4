"""Calibration: the profile a plan needs, measured where it can be and described where the user says so.

Compute is measured here for the job's model (a profile measured on another model is not
reused for it), and the real training loop at the job's batch size (a measured profile gains
one loop factor per batch size it is planned at). A saved profile's network is reused;
otherwise the network is measured between the first two of the given hosts, each rank started
through the cluster's remote command. When several workers share a machine, loopback is measured
on the first host (on this machine when no host is given): assumed, it priced the all-reduce of
127 kB between two busy workers of a 2-core VM at 0.2 ms a step, where it took 1.8-2.0 ms. A link
the user describes (`--link 1gbit --latency 0.1ms`) is taken at the share of its rate that shoal's
exchange was measured to reach on such a link, each message at the latency given, else the probed one
(a saved measured network's), else 0.1 ms.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys

from shoal.bench.machine import describe
from shoal.cluster.remote import remote_command
from shoal.config import JobConfig
from shoal.errors import ConfigError
from shoal.plan.compute_probe import measure_compute, model_key, with_loop_at
from shoal.plan.costs import Link
from shoal.plan.network_probe import links, probe_command, probe_sizes, run_pair
from shoal.plan.profile import Network, Profile

DEFAULT_RATE, DEFAULT_LATENCY = "1gbit", "0.1ms"
# A link's nominal rate (bits per second) -> the share of it shoal's exchange reaches: the network probe's
# all-reduces (a busy worker's) between 2 emulated hosts (tc tbf, one core each) on a 2-core VM, the median over
# messages of 64 kB to 5 MB at 10 and 100 Mbit/s, of 0.5 MB and more at 1 Gbit/s (smaller ones reached 0.25-0.35
# there: about 1 ms a message, which --latency describes), benchmarks/results/2026-11-28-2core-cpu-link-efficiency.md.
# TCP/IP headers take 4% of a frame; the rest is the shaper's pacing and the hosts' kernel work beside gloo's.
REACHED_SHARE = {10e6: 0.80, 100e6: 0.70, 1e9: 0.55}
LOOPBACK = Link(latency=30e-6, bandwidth=2e9)  # inside a machine, where one worker per machine never uses it
LOCAL = "127.0.0.1"
RATE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_rate(text: str, where: str = "--link") -> float:
    """'1gbit', '100mbit', '10Mbit', '1e9' -> bits per second."""
    match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([kmgt]?)(?:bit|bps|b)?(?:/s)?\s*", text.lower())
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(f"{where}: cannot read {text!r} as a link rate (like 1gbit, 100mbit, 10mbit)")
    return float(match.group(1)) * RATE_UNITS[match.group(2)]


def parse_latency(text: str, where: str = "--latency") -> float:
    """'0.1ms', '50us', '0' -> seconds."""
    match = re.fullmatch(r"\s*([0-9.]+(?:e-?[0-9]+)?)\s*(s|ms|us|µs|ns)?\s*", text.lower())
    if match is None:
        raise ConfigError(f"{where}: cannot read {text!r} as a time (like 0.1ms, 50us)")
    return float(match.group(1)) * TIME_UNITS[match.group(2) or "s"]


def reached_share(bits_per_second: float) -> float:
    """The share of a nominal rate shoal's exchange reaches: as measured at the nearest rates of REACHED_SHARE,
    interpolated in log rate between them, the nearest one's beyond them."""
    rates = sorted(REACHED_SHARE)
    if bits_per_second <= rates[0] or bits_per_second >= rates[-1]:
        return REACHED_SHARE[rates[0] if bits_per_second <= rates[0] else rates[-1]]
    high = next(rate for rate in rates if rate >= bits_per_second)
    low = rates[rates.index(high) - 1]
    weight = math.log(bits_per_second / low) / math.log(high / low)
    return REACHED_SHARE[low] + weight * (REACHED_SHARE[high] - REACHED_SHARE[low])


def described_network(rate: str, latency: str | None = None, inside: Link = LOOPBACK,
                      probed: Link | None = None) -> Network:
    """A link known by its nominal rate, priced at what shoal's exchange reaches of it (REACHED_SHARE). Each
    message costs `latency` as given, else `probed`'s fixed cost (a measured link's, when the profile has one),
    else DEFAULT_LATENCY: never nothing, as no exchange is free of its per-message work."""
    bits = parse_rate(rate)
    share = reached_share(bits)
    if latency is not None:
        seconds, how = parse_latency(latency), "given"
    elif probed is not None:
        seconds, how = probed.latency, "as probed"
    else:
        seconds, how = parse_latency(DEFAULT_LATENCY), "assumed (--latency sets it)"
    link = Link(latency=seconds, bandwidth=bits / 8 * share)
    return Network(across=link, inside=inside,
                   source=f"described: {rate}, {seconds * 1e3:.3g} ms per message {how}; priced at {share:.0%} of "
                          "the rate, what shoal's exchange reached on emulated links of that rate")


def measured_pair(first: str, second: str, template: str | None, port: int, sizes: list[int],
                  messages: bool = True) -> dict:
    """Rank 0 on `first`, rank 1 on `second` (through `template`, or here when it is None); point-to-point
    messages timed too with `messages`."""
    address = first if template else LOCAL
    commands = [probe_command(rank, address, peer if template else address, port, sizes, messages=messages)
                for rank, peer in enumerate((second, first))]
    if template:
        commands = [remote_command(template, host, command) for host, command in zip((first, second), commands)]
    return run_pair(commands, f"{first} and {second}")


def measure_network(hosts: list[str], template: str, port: int, message: int, messages: bool = True) -> Network:
    """The link between the first two hosts (its point-to-point messages too with `messages`: a parameter
    server is planned), at sizes around `message` bytes; loopback assumed (`calibrate` measures it where
    workers share a machine)."""
    print(f"shoal plan: measuring the network between {hosts[0]} and {hosts[1]}", file=sys.stderr)
    sizes = probe_sizes(message)
    results = measured_pair(hosts[0], hosts[1], template, port, sizes, messages)
    across, message_link = links(results)
    return Network(across=across, inside=LOOPBACK, message_across=message_link,
                   slowest_host=results["pace"], source=f"measured between {hosts[0]} and {hosts[1]}")


def measure_loopback(host: str | None, template: str | None, port: int, message: int) -> Link:
    """Loopback between two workers of one machine: `host`'s (through `template`), or this one's when None. A
    server among workers of one machine is priced on loopback's ring link, so no messages are timed there."""
    print(f"shoal plan: measuring loopback on {host or 'this machine'}", file=sys.stderr)
    where = host or LOCAL
    return links(measured_pair(where, where, template if host else None, port, probe_sizes(message), False))[0]


def calibrate(job: JobConfig, profile: Profile | None, *, threads: int, hosts: list[str] | None = None,
              described: Network | None = None, per_node: int = 1, messages: bool = True) -> Profile:
    """A profile for planning `job`: what `profile` holds that still applies, the rest measured, or the
    network `described`. `messages`: a parameter server is planned, so the network's point-to-point
    messages are measured too (a saved measured network without them is measured again)."""
    profile = profile or Profile()
    compute = profile.compute
    if compute is None or compute.threads != threads or compute.model != model_key_of(job):
        print(f"shoal plan: measuring this machine's compute for the job's model ({threads} thread(s))",
              file=sys.stderr)
        compute = measure_compute(job, threads)
    elif compute.loop_factors and job.train.batch_size not in compute.loop_factors:  # measured, not described
        print(f"shoal plan: measuring the training loop at batch {job.train.batch_size}", file=sys.stderr)
        compute = with_loop_at(compute, job, threads)
    network = described or profile.network
    can_measure = bool(hosts) and len(hosts) > 1
    message = 4 * compute.parameters  # bytes of a float32 model's weights or gradients
    if described is None and network is not None and can_measure and messages and lacks_messages(network):
        network = None  # measured for collectives alone: a server's messages cost more than a ring's halves
    if network is None and can_measure:
        network = measure_network(hosts, job.cluster.remote, job.cluster.port, message, messages)
    elif network is None:
        network = described_network(DEFAULT_RATE)
    if per_node > 1 and not network.inside.measured:  # workers share a machine: its loopback measured, not assumed
        inside = measure_loopback(hosts[0] if hosts else None, job.cluster.remote, job.cluster.port, message)
        network = dataclasses.replace(network, inside=inside)
    machine = profile.machine if compute is profile.compute and profile.machine else describe()
    return Profile(machine=machine, compute=compute, network=network)


def lacks_messages(network: Network) -> bool:
    """A measured network (its links keep their points; a described one has none) without point-to-point
    messages: it was measured for collective algorithms alone."""
    return network.across.measured and network.message_across is None


def model_key_of(job: JobConfig) -> str:
    from shoal.data.format import open_dataset
    from shoal.train.prepare import model_spec

    return model_key(model_spec(job, open_dataset(job.data.train)))
