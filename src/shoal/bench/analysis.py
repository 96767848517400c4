"""A study's trials summarized per dataset size (means, spread, ANOVA, Tukey groups, speedup, thresholds), and
across sizes (a two-way ANOVA of size and worker count with their interaction)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from shoal.bench.statistics import (
    AnovaRow,
    Comparison,
    Threshold,
    letter_groups,
    one_way_anova,
    thresholds,
    tukey_hsd,
    two_way_anova,
)
from shoal.errors import ConfigError
from shoal.events import SPLIT_PARTS

SPLIT = SPLIT_PARTS  # the CSV has a `<part>_seconds` column for each part of an epoch
MEASURES = ("train_seconds", "job_seconds", "wall_seconds")


@dataclass
class Cell:
    """The trials of one worker count at one size."""

    workers: int
    values: list[float]
    split: dict[str, float]
    """Mean seconds of each part of the training time over the trials."""
    accuracy: float | None
    auc: float | None
    load: float | None = None
    """Mean seconds the workers took to load their data (cNeural's load time); None in older studies."""

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def deviation(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) > 1 else None


@dataclass
class SizeSummary:
    label: str
    rows: int
    cells: dict[int, Cell]
    anova: list[AnovaRow] | None = None
    comparisons: list[Comparison] = field(default_factory=list)
    letters: dict[int, str] = field(default_factory=dict)
    note: str = ""
    """Why there is no ANOVA for this size, if there is none."""

    def speedup(self, workers: int) -> float:
        """Mean time of the fewest workers over the mean time of `workers`."""
        return self.cells[min(self.cells)].mean / self.cells[workers].mean


@dataclass
class Analysis:
    measure: str
    alpha: float
    sizes: list[SizeSummary]
    workers: list[int]
    thresholds: list[Threshold]
    cores: int
    oversubscribed: list[int]
    """Worker counts whose workers x threads exceed the cores."""
    hosts: str = ""
    """The machines of a study across machines (the widest trial's), else ""."""
    trainers: dict[int, int] = field(default_factory=dict)
    """Per worker count, the workers that train: fewer than the workers where a parameter server and its
    sub-masters serve (Downpour), so the ideal speedup follows the trainers, not the workers."""
    two_way: list[AnovaRow] | None = None
    """Size, workers and size:workers over every trial (Type II sums); None where the grid cannot give it."""
    two_way_note: str = ""

    def ideal_speedup(self, workers: int) -> float:
        """The speedup over the fewest workers if training time fell in proportion to the trainers."""
        base = min(self.workers)
        return self.trainers.get(workers, workers) / self.trainers.get(base, base)


def analyze(rows: list[dict], measure: str = "train_seconds", alpha: float = 0.05) -> Analysis:
    """Summaries of every size of the study's rows (as `read_trials` gives them)."""
    if measure not in MEASURES:
        raise ConfigError(f"--measure: one of {', '.join(MEASURES)}, got {measure!r}")
    if not 0 < alpha < 1:
        raise ConfigError(f"--alpha: must be between 0 and 1, got {alpha}")
    if not rows:
        raise ConfigError("the study has no finished trial yet")
    by_size: dict[str, list[dict]] = {}
    for row in rows:
        by_size.setdefault(row["size"], []).append(row)
    sizes = []
    for label, members in sorted(by_size.items(), key=lambda item: (item[1][0]["rows"], item[0])):
        cells = {}
        for count in sorted({row["workers"] for row in members}):
            trials = [row for row in members if row["workers"] == count]
            cells[count] = Cell(count, [row[measure] for row in trials],
                                {part: statistics.fmean(row[f"{part}_seconds"] for row in trials) for part in SPLIT},
                                _mean(row["test_accuracy"] for row in trials), _mean(row["test_auc"] for row in trials),
                                _mean(row.get("load_seconds") for row in trials))
        sizes.append(_test(SizeSummary(label, members[0]["rows"], cells), alpha))
    workers = sorted({row["workers"] for row in rows})
    # thresholds in rows; sizes without comparisons (one worker count, one trial) count as no win
    by_rows = {size.rows: size.comparisons for size in sizes}
    cores = min(row["cores"] for row in rows)
    oversubscribed = sorted({row["workers"] for row in rows if row["workers"] * row["threads"] > row["cores"]})
    hosts = max((row.get("hosts") or "" for row in rows), key=lambda names: len(names.split()))
    trainers = {row["workers"]: row.get("trainers") or row["workers"] for row in rows}
    analysis = Analysis(measure, alpha, sizes, workers, thresholds(by_rows, workers), cores, oversubscribed,
                        hosts.replace(" ", ", "), trainers)
    return _two_way(analysis)


def _two_way(analysis: Analysis) -> Analysis:
    """The two-way ANOVA where the grid has two sizes, two worker counts and more trials than cells."""
    observations = [(size.label, count, value) for size in analysis.sizes for count, cell in size.cells.items()
                    for value in cell.values]
    try:
        analysis.two_way = two_way_anova(observations, ("size", "workers"))
    except ValueError as reason:
        analysis.two_way_note = str(reason)
    return analysis


def _mean(values) -> float | None:
    """The mean of the values that are there (a job without a test set has none)."""
    present = [value for value in values if value is not None]
    return statistics.fmean(present) if present else None


def _test(size: SizeSummary, alpha: float) -> SizeSummary:
    """ANOVA, Tukey's HSD and letters for one size, where the trials allow them."""
    groups = {count: cell.values for count, cell in size.cells.items()}
    if len(groups) < 2:
        size.note = "one worker count: nothing to compare"
    elif sum(len(values) for values in groups.values()) <= len(groups):
        size.note = "one trial per worker count: no within-group variance to test against"
    else:
        size.anova = one_way_anova(groups)
        size.comparisons = tukey_hsd(groups, alpha)
        size.letters = letter_groups({count: cell.mean for count, cell in size.cells.items()}, size.comparisons)
    return size
