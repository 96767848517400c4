"""Several profiles read as one: each measured number the median of its measurements.

One calibration is one sample of a machine's state, and a shared or virtual machine's speed
drifts for minutes at a time (on a 2-core VM one probe's loop factor at batch 128 read 1.58
where others read 0.99-1.04). Profiles saved at different times (`shoal plan --profile a.json
--profile b.json --profile c.json`) give a plan that one slow or fast moment does not move: every
number is the median of the profiles that have it, key by key in its tables, except that a step
and its loop factor, measured together, are kept together: the real step is their product's median.
How far the profiles' real steps lie apart is kept too (the pace range): a plan is no steadier than the
machine it was measured on.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from shoal.errors import ConfigError
from shoal.plan.costs import Link
from shoal.plan.profile import Compute, Network, Profile, slowest_over_fastest

SAME = ("model", "parameters", "threads")  # what makes two computes measurements of one thing


def median_profile(profiles: list[tuple[Path, Profile]]) -> Profile:
    """The median of `profiles` (each with the path it was read from, to name one that does not fit)."""
    if len(profiles) == 1:
        return profiles[0][1]
    computes = [(path, profile.compute) for path, profile in profiles if profile.compute is not None]
    networks = [profile.network for _, profile in profiles if profile.network is not None]
    return Profile(machine=profiles[0][1].machine, compute=median_compute(computes) if computes else None,
                   network=median_network(networks) if networks else None)


def median_compute(computes: list[tuple[Path, Compute]]) -> Compute:
    first_path, first = computes[0]
    for path, compute in computes[1:]:
        for name in SAME:
            if getattr(compute, name) != getattr(first, name):
                raise ConfigError(f"{path}: compute.{name}: {getattr(compute, name)!r} where {first_path} has "
                                  f"{getattr(first, name)!r} (profiles combined must be of one model and threads)")
    values = {}
    for field in dataclasses.fields(Compute):
        if field.name not in (*SAME, "step_seconds", "pace_range"):
            values[field.name] = median_of([getattr(compute, field.name) for _, compute in computes])
    values["pace_range"] = pace_range([compute for _, compute in computes])
    merged = dataclasses.replace(first, **values)
    return dataclasses.replace(merged, step_seconds=real_steps([compute for _, compute in computes], merged))


def real_steps(computes: list[Compute], merged: Compute) -> dict[int, float]:
    """Each batch size's probed step for `merged` (every other number already combined), set so that it times
    `merged`'s loop factor gives the median of the profiles' own real steps (probed step x loop factor), over
    the profiles that have the batch size. A profile's factor is its real loop over the probed step timed
    beside it, so the two are one measurement: taken apart, one profile's slow probe and another's low factor
    both land in the plan (on a 2-core VM 784-40-10 at batch 128 probed 0.695, 0.840 and 0.713 ms with
    factors 1.07, 0.90 and 0.61: real steps of 0.746, 0.756 and 0.434 ms, median 0.746, where the medians
    taken apart gave 0.642 and its one-host epochs ran at 0.82-0.87 ms a step)."""
    found = {}
    for batch in dict.fromkeys(batch for compute in computes for batch in compute.step_seconds):
        found[batch] = statistics.median(real_steps_at(computes, batch)) / merged.loop_factor(batch)
    return found


def real_steps_at(computes: list[Compute], batch: int) -> list[float]:
    """Each profile's real step at `batch` (its probed step x its loop factor), over those that probed it."""
    return [compute.step_seconds[batch] * compute.loop_factor(batch) for compute in computes
            if batch in compute.step_seconds]


def pace_range(computes: list[Compute]) -> float:
    """The widest of the profiles' own pace ranges and of their real steps' (probed step x loop factor) at each
    batch size every one of them ran the real loop at: how far the machine's pace moved between calibrations."""
    ranges = [compute.pace_range for compute in computes]
    for batch in set.intersection(*(set(compute.loop_factors) for compute in computes)):
        ranges.append(slowest_over_fastest(real_steps_at(computes, batch)))
    return max(ranges)


def median_network(networks: list[Network]) -> Network:
    messages = [network.message_across for network in networks if network.message_across is not None]
    sources = list(dict.fromkeys(network.source for network in networks))
    return Network(across=median_link([network.across for network in networks]),
                   inside=median_link([network.inside for network in networks]),
                   message_across=median_link(messages) if messages else None,
                   slowest_host=median_of([network.slowest_host for network in networks]),
                   source=f"median of {len(networks)} profiles, {'; '.join(sources)}")


def median_link(links: list[Link]) -> Link:
    """The median link; priced through its points (as format-2 profiles were) only when every profile's was."""
    points = median_of([dict(link.points) for link in links])
    return Link(latency=median_of([link.latency for link in links]),
                bandwidth=median_of([link.bandwidth for link in links]), points=tuple(sorted(points.items())),
                interpolated=all(link.interpolated for link in links))


def median_of(values: list):
    """The median of numbers, or of tables key by key over the tables that have the key."""
    if isinstance(values[0], dict):
        keys = dict.fromkeys(key for table in values for key in table)
        return {key: statistics.median(table[key] for table in values if key in table) for key in keys}
    return statistics.median(values)
