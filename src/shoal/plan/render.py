"""A plan as the terminal shows it (one table, a sentence per algorithm, the recommendations) and as curves in a PNG.

The sentences say in words a newcomer reads what the table means: `sync: faster than one machine from
2 machines on (1.80x on 4)`. An unsteady measurement is said twice, at the top beside what was measured
and at the bottom in the recommendation's place, with how to get a steady one. On machines of
different speeds the table gains a `shares` column: each algorithm on each node count twice, with
equal shares (the slowest machine sets the pace) and with speed shares."""

from __future__ import annotations

from pathlib import Path

from shoal.plan.costs import Link
from shoal.plan.planner import UNSTEADY, Forecast, against_one_machine, job_to_beat, machine_count_text, shares_text
from shoal.plan.profile import Profile
from shoal.run.report import save_atomically


def seconds_text(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"


def link_text(link: Link) -> str:
    return f"{link.latency * 1e3:.3f} ms per message, {link.bandwidth * 8 / 1e6:,.1f} Mbit/s"


def render(plan: Forecast, profile: Profile, per_node: int) -> str:
    compute, network = profile.compute, profile.network
    lines = [f"compute: {compute.parameters:,} parameters, {compute.threads} thread(s) per worker, "
             f"start-up {compute.startup_seconds:.1f} s (measured on {profile.machine.get('host', '?')})",
             f"network: {network.source}: {link_text(network.across)}"]
    if network.interpolated:
        lines.append("note: a profile of format 2, whose measured links are priced through their points as they were "
                     "then; measure again (without --profile) to price each message's latency and bytes apart")
    if plan.pace_range > UNSTEADY:
        lines.append(f"unsteady: a step took up to {plan.pace_range:.2f}x its fastest time while this machine was "
                     f"measured; epochs will move as much{', so no recommendation (below)' if plan.withheld else ''}")
    if per_node > 1:
        lines.append(f"loopback: {'measured' if network.inside.measured else 'assumed'}: {link_text(network.inside)}")
    if plan.speeds:
        lines.append(f"machines: {machines_text(plan.speeds)} (each one's speed against the profile's machine, "
                     "in rank order: N nodes are the first N)")
    lines.append("")
    shares = ["shares"] if plan.speeds else []
    header = ["nodes", "workers", "algorithm", *shares, "epoch", "job", "speedup", "efficiency", "comm.",
              "staleness"]
    rows = [[str(p.nodes), str(p.workers), p.algorithm, *([p.balance] if shares else []),
             seconds_text(p.epoch_seconds), seconds_text(p.job_seconds), f"{plan.speedup(p):.2f}x",
             f"{plan.efficiency(p):.0%}", f"{p.communication_share:.0%}",
             "" if p.staleness is None else f"{p.staleness:.1f}"] for p in plan.predictions]
    lines += _table(header, rows, text_columns=(2, 3) if shares else (2,))
    start = job_to_beat(plan)
    lines += ["", f"against {machine_count_text(start.nodes)} (the fastest job there: {shares_text(start)}, "
                  f"{seconds_text(start.job_seconds)}):"]
    lines += [f"  {series}: {sentence}" for series, sentence in against_one_machine(plan).items()]
    lines += ["", f"no recommendation: {plan.withheld}" if plan.withheld else f"recommended: {plan.recommendation}"]
    if plan.compression:
        lines.append(f"compression: {plan.compression}")
    return "\n".join(lines)


def machines_text(speeds: tuple[float, ...]) -> str:
    """`2 x 1.00, 1 x 0.50`: the machines' speeds, runs of one speed counted."""
    runs: list[list] = []
    for speed in speeds:
        if runs and runs[-1][1] == speed:
            runs[-1][0] += 1
        else:
            runs.append([1, speed])
    return ", ".join(f"{count} x {speed:.2f}" for count, speed in runs)


def _table(header: list[str], rows: list[list[str]], text_columns: tuple[int, ...] = (2,)) -> list[str]:
    """Numbers right-aligned, the `text_columns` left-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) if i in text_columns else cell.rjust(width) for i, (cell, width) in
                      enumerate(zip(row, widths))).rstrip() for row in [header, *rows]]


def plot(plan: Forecast, path: Path) -> Path:
    """Two panels: predicted job time against nodes per algorithm, and against dataset size per node count."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    by_nodes, by_rows = figure.subplots(1, 2)
    for series in plan.crossovers:
        own = [p for p in plan.predictions if p.label == series]
        by_nodes.plot([p.nodes for p in own], [p.job_seconds for p in own], marker="o", label=series)
    by_nodes.set(xscale="log", yscale="log", xlabel="nodes", ylabel="predicted job seconds",
                 title="job time against cluster size")
    by_nodes.legend()
    first = next(iter(plan.crossovers))
    own = [p for p in plan.predictions if p.label == first]
    sizes = [own[0].rows * factor for factor in (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100)]
    for prediction in own:
        by_rows.plot(sizes, [prediction.line.at(rows) for rows in sizes], label=f"{prediction.nodes} node(s)")
    by_rows.set(xscale="log", yscale="log", xlabel="training rows", ylabel="predicted job seconds",
                title=f"{first}: job time against dataset size")
    by_rows.legend()
    save_atomically(Path(path), lambda temporary: figure.savefig(temporary, dpi=110, format="png"))
    return path
