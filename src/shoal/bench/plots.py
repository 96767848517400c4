"""The scaling study's figures (PNG): the Parallel SGD study's time curves and box plots (with their means),
mpi_learn's speedup curve with its ideal line, cNeural's split of training time into computation and
communication, one bar per worker count, and cNeural's load time against the cluster size."""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from shoal.bench.analysis import SPLIT, Analysis

MEASURE_TEXT = {"train_seconds": "training time (s)", "job_seconds": "job time after loading (s)",
                "wall_seconds": "wall time per trial (s)"}


def _figure(panels: int = 1, columns: int = 1) -> tuple[Figure, list]:
    rows = math.ceil(panels / columns)
    figure = Figure(figsize=(4.6 * columns + 1.8, 3.6 * rows + 0.4), layout="constrained")
    axes = [figure.add_subplot(rows, columns, index + 1) for index in range(panels)]
    for ax in axes:
        ax.grid(alpha=0.3)
    return figure, axes


def _panel_per_size(analysis: Analysis) -> tuple[Figure, list]:
    """A figure with a panel per dataset size, three to a row; (panel, size) pairs."""
    figure, axes = _figure(len(analysis.sizes), min(3, len(analysis.sizes)))
    return figure, list(zip(axes, analysis.sizes))


def _size_text(size) -> str:
    return f"{size.label} ({size.rows:,} rows)"


def _finish(ax, title: str, ylabel: str) -> None:
    """Axis label, title, and the legend beside the plot (inside, it would cover the lines)."""
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")


def _worker_axis(ax, workers: list[int]) -> None:
    """Worker counts on a log-2 axis, labelled with the counts themselves."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(workers))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("workers")


def plot_time_by_size(analysis: Analysis) -> Figure:
    """Mean time (with one standard deviation) against dataset rows, a line per worker count."""
    figure, (ax,) = _figure()
    for count in analysis.workers:
        points = [(size.rows, size.cells[count]) for size in analysis.sizes if count in size.cells]
        ax.errorbar([rows for rows, _ in points], [cell.mean for _, cell in points],
                    yerr=[cell.deviation or 0.0 for _, cell in points], marker="o", capsize=3,
                    label=f"{count} worker{'' if count == 1 else 's'}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("dataset rows")
    _finish(ax, "time against dataset size", MEASURE_TEXT[analysis.measure])
    return figure


def plot_time_by_workers(analysis: Analysis) -> Figure:
    """Mean time against worker count (log axes), a line per dataset size."""
    figure, (ax,) = _figure()
    for size in analysis.sizes:
        counts = sorted(size.cells)
        ax.errorbar(counts, [size.cells[count].mean for count in counts],
                    yerr=[size.cells[count].deviation or 0.0 for count in counts], marker="o", capsize=3,
                    label=_size_text(size))
    _worker_axis(ax, analysis.workers)
    ax.set_yscale("log")
    _finish(ax, "time against cluster size", MEASURE_TEXT[analysis.measure])
    return figure


def plot_boxes(analysis: Analysis) -> Figure:
    """The trials' times per worker count, one panel per dataset size: the median as a line, the mean as a
    triangle, Tukey letters above the boxes."""
    figure, panels = _panel_per_size(analysis)
    for ax, size in panels:
        counts = sorted(size.cells)
        ax.boxplot([size.cells[count].values for count in counts], tick_labels=[str(count) for count in counts],
                   showmeans=True, meanprops={"marker": "^", "markerfacecolor": "white", "markeredgecolor": "black"})
        for position, count in enumerate(counts, start=1):
            if count in size.letters:
                ax.annotate(size.letters[count], (position, max(size.cells[count].values)), xytext=(0, 4),
                            textcoords="offset points", ha="center", va="bottom")
        ax.set_title(_size_text(size), fontsize="medium")
        ax.set_xlabel("workers")
        ax.set_ylabel(MEASURE_TEXT[analysis.measure])
        ax.margins(y=0.15)
    return figure


def plot_speedup(analysis: Analysis) -> Figure:
    """Speedup over the fewest workers per dataset size, with the ideal (linear) line."""
    figure, (ax,) = _figure()
    base = min(analysis.workers)
    ideal = "ideal" if all(analysis.trainers.get(count, count) == count for count in analysis.workers) else \
        "ideal (by trainers: a server's ranks do not train)"
    ax.plot(analysis.workers, [analysis.ideal_speedup(count) for count in analysis.workers], linestyle="--",
            color="gray", label=ideal)
    for size in analysis.sizes:
        if base not in size.cells:
            continue
        counts = sorted(size.cells)
        ax.plot(counts, [size.speedup(count) for count in counts], marker="o", label=f"{size.label}")
    _worker_axis(ax, analysis.workers)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(ScalarFormatter())
    _finish(ax, "speedup against cluster size", f"speedup over {base} worker{'s' if base > 1 else ''}")
    return figure


def plot_split(analysis: Analysis) -> Figure:
    """Mean computation, communication, data and evaluation seconds per worker count, a panel per size."""
    figure, panels = _panel_per_size(analysis)
    for ax, size in panels:
        counts = sorted(size.cells)
        positions = range(len(counts))
        bottom = [0.0] * len(counts)
        for part in SPLIT:
            heights = [size.cells[count].split[part] for count in counts]
            ax.bar(positions, heights, bottom=bottom, label=part)
            bottom = [low + height for low, height in zip(bottom, heights)]
        ax.set_xticks(list(positions), [str(count) for count in counts])
        ax.set_xlabel("workers")
        ax.set_ylabel("seconds (mean over workers and trials)")
        ax.set_title(_size_text(size), fontsize="medium")
    handles, labels = panels[0][0].get_legend_handles_labels()
    figure.legend(handles[::-1], labels[::-1], loc="outside right upper")
    return figure


def plot_load(analysis: Analysis) -> Figure:
    """Mean load time (the workers' reading of their data, before the first epoch) against worker count, a line
    per dataset size (cNeural's Figure 5); sizes of studies that did not record it are left out."""
    figure, (ax,) = _figure()
    drawn = False
    for size in analysis.sizes:
        counts = [count for count in sorted(size.cells) if size.cells[count].load is not None]
        if counts:
            ax.plot(counts, [size.cells[count].load for count in counts], marker="o", label=_size_text(size))
            drawn = True
    _worker_axis(ax, analysis.workers)
    if not drawn:
        ax.text(0.5, 0.5, "this study recorded no load times", transform=ax.transAxes, ha="center")
        ax.set_title("load time against cluster size")
        return figure
    _finish(ax, "load time against cluster size", "load time (s, mean over trials)")
    return figure


PLOTS = (
    ("time_by_size.png", plot_time_by_size, "time against dataset size, a line per cluster size"),
    ("time_by_workers.png", plot_time_by_workers, "time against cluster size (log axes), a line per dataset size"),
    ("boxes.png", plot_boxes, "the trials' times per cluster size, with Tukey's letter groups"),
    ("speedup.png", plot_speedup, "speedup against cluster size, with the ideal line"),
    ("split.png", plot_split, "where the training time went, per cluster size"),
    ("load.png", plot_load, "the data's load time against cluster size, a line per dataset size"),
)
