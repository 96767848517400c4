"""One- and two-way ANOVA, Tukey's HSD and compact letter groupings of training times by worker count.

The Parallel SGD study (Kennedy et al.) asks, for each dataset size, whether the cluster size
changes the training time at all (a one-way ANOVA: Df, Sum Sq, Mean Sq, F value, Pr(>F), as R
prints it) and which cluster sizes differ (Tukey's honestly significant difference, all pairs,
summarized as letter groups: cluster sizes that share a letter are not significantly
different). Across sizes, a two-way ANOVA (size, cluster size and their interaction) asks whether
the cluster size matters once the size is accounted for, and whether its effect changes with the
size. The sums of squares are computed here; the F and studentized range distributions come from
scipy.
"""

from __future__ import annotations

import math
import string
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class AnovaRow:
    """One line of an ANOVA table; F and p are None on the Residuals line."""

    source: str
    df: int
    sum_sq: float
    mean_sq: float
    f_value: float | None = None
    p_value: float | None = None


@dataclass(frozen=True)
class Comparison:
    """Tukey's HSD for one pair: difference of means (second - first), its interval, adjusted p."""

    first: int
    second: int
    difference: float
    lower: float
    upper: float
    p_value: float
    significant: bool


def one_way_anova(groups: Mapping[int, Sequence[float]], factor: str = "workers") -> list[AnovaRow]:
    """The factor's line and the Residuals line of a one-way ANOVA of the values by group.

    With no residual degrees of freedom (one value per group) F and p are NaN; identical values
    within every group give an infinite F when the group means differ.
    """
    samples = [np.asarray(values, dtype=np.float64) for values in groups.values()]
    if len(samples) < 2 or any(len(sample) == 0 for sample in samples):
        raise ValueError("an ANOVA needs at least two groups, each with a value")
    everything = np.concatenate(samples)
    grand_mean = everything.mean()
    between = sum(len(sample) * (sample.mean() - grand_mean) ** 2 for sample in samples)
    within = sum(((sample - sample.mean()) ** 2).sum() for sample in samples)
    df_between, df_within = len(samples) - 1, len(everything) - len(samples)
    mean_between = between / df_between
    mean_within = within / df_within if df_within else math.nan
    if df_within == 0:
        f_value = p_value = math.nan
    elif mean_within == 0:
        f_value = math.inf if mean_between > 0 else math.nan
        p_value = 0.0 if mean_between > 0 else math.nan
    else:
        f_value = mean_between / mean_within
        p_value = float(stats.f.sf(f_value, df_between, df_within))
    return [AnovaRow(factor, df_between, float(between), float(mean_between), float(f_value), p_value),
            AnovaRow("Residuals", df_within, float(within), float(mean_within))]


def two_way_anova(observations: Sequence[tuple[Hashable, Hashable, float]],
                  factors: tuple[str, str] = ("size", "workers")) -> list[AnovaRow]:
    """Two-way ANOVA with interaction of (first level, second level, value) observations: a line per factor,
    one for their interaction (`first:second`), and Residuals.

    Sums of squares are Type II (each factor adjusted for the other; the interaction for both), from
    least-squares fits of nested models, so a cell with fewer trials is handled as R's car::Anova and
    statsmodels' anova_lm(typ=2) handle it; for a balanced design they are the classical sums. Degrees of
    freedom are the ranks the data give each term, so a grid with empty cells (a worker count not run at
    some size) tests what its filled cells can estimate, where those two refuse or count terms with no data.
    """
    first = [observation[0] for observation in observations]
    second = [observation[1] for observation in observations]
    values = np.asarray([observation[2] for observation in observations], dtype=np.float64)
    a_terms, b_terms = _dummies(first), _dummies(second)
    if a_terms.shape[1] == 0 or b_terms.shape[1] == 0:
        raise ValueError("a two-way ANOVA needs at least two levels of each factor")
    interaction = np.column_stack([a_terms[:, i] * b_terms[:, j]
                                   for i in range(a_terms.shape[1]) for j in range(b_terms.shape[1])])
    intercept = np.ones((len(values), 1))
    fits = {name: _fit(values, np.hstack([intercept, *parts]))
            for name, parts in {"a": [a_terms], "b": [b_terms], "ab": [a_terms, b_terms],
                                "full": [a_terms, b_terms, interaction]}.items()}
    # what rounding leaves of an exact fit is no variance: it would make an F of 1e15 from nothing
    tolerance = 1e-20 * float(values @ values)
    residual_sum, residual_rank = fits["full"]
    residual_sum = residual_sum if residual_sum > tolerance else 0.0
    residual_df = len(values) - residual_rank
    if residual_df <= 0:
        raise ValueError("a two-way ANOVA with interaction needs more values than cells (several trials per cell)")
    residual_mean = residual_sum / residual_df
    terms = [(factors[0], fits["b"], fits["ab"]), (factors[1], fits["a"], fits["ab"]),
             (f"{factors[0]}:{factors[1]}", fits["ab"], fits["full"])]
    rows = []
    for name, (reduced_sum, reduced_rank), (larger_sum, larger_rank) in terms:
        df, sum_sq = larger_rank - reduced_rank, reduced_sum - larger_sum
        sum_sq = sum_sq if sum_sq > tolerance else 0.0
        mean_sq = sum_sq / df if df else math.nan
        f_value, p_value = _f_test(mean_sq, residual_mean, df, residual_df)
        rows.append(AnovaRow(name, df, float(sum_sq), float(mean_sq), f_value, p_value))
    return [*rows, AnovaRow("Residuals", residual_df, float(residual_sum), float(residual_mean))]


def _dummies(levels: Sequence[Hashable]) -> np.ndarray:
    """Treatment coding: a 0/1 column for every level but the first (in sorted order)."""
    names = sorted(set(levels))
    return np.column_stack([[float(level == name) for level in levels] for name in names[1:]]) if len(names) > 1 \
        else np.zeros((len(levels), 0))


def _fit(values: np.ndarray, design: np.ndarray) -> tuple[float, int]:
    """The residual sum of squares of the least-squares fit, and the design's rank."""
    coefficients, _, rank, _ = np.linalg.lstsq(design, values, rcond=None)
    residuals = values - design @ coefficients
    return float(residuals @ residuals), int(rank)


def _f_test(mean_sq: float, residual_mean: float, df: int, residual_df: int) -> tuple[float, float]:
    """F and its p-value; an exact fit (no residual variance) gives an infinite F where the term explains any."""
    if df == 0:
        return math.nan, math.nan
    if residual_mean == 0:
        return (math.inf, 0.0) if mean_sq > 0 else (math.nan, math.nan)
    f_value = mean_sq / residual_mean
    return float(f_value), float(stats.f.sf(f_value, df, residual_df))


def tukey_hsd(groups: Mapping[int, Sequence[float]], alpha: float = 0.05) -> list[Comparison]:
    """Every pair of groups (in key order) compared with Tukey's HSD at family-wise level `alpha`."""
    keys = sorted(groups)
    samples = [np.asarray(groups[key], dtype=np.float64) for key in keys]
    if len(samples) < 2 or sum(len(sample) for sample in samples) <= len(samples):
        raise ValueError("Tukey's HSD needs two groups and more values than groups")
    result = stats.tukey_hsd(*samples)
    interval = result.confidence_interval(confidence_level=1 - alpha)
    comparisons = []
    for i, first in enumerate(keys):
        for j in range(i + 1, len(keys)):
            # scipy's statistic[i, j] is mean_i - mean_j; report second - first as R and statsmodels do
            p_value = float(result.pvalue[i, j])
            comparisons.append(Comparison(first, keys[j], float(-result.statistic[i, j]), float(-interval.high[i, j]),
                                          float(-interval.low[i, j]), p_value, bool(p_value < alpha)))
    return comparisons


def letter_groups(means: Mapping[int, float], comparisons: Sequence[Comparison]) -> dict[int, str]:
    """Compact letter display: groups sharing a letter do not differ significantly.

    Piepho's insert-and-absorb: start with one set holding every group; each significant pair
    splits every set holding both into one without each; sets inside another are dropped. The
    letter 'a' goes to the set holding the largest mean (the slowest cluster size when the values
    are times), as R's agricolae prints it.
    """
    sets: list[frozenset[int]] = [frozenset(means)]
    for comparison in comparisons:
        if not comparison.significant:
            continue
        pair = {comparison.first, comparison.second}
        split = []
        for members in sets:
            if pair <= members:
                split += [members - {comparison.first}, members - {comparison.second}]
            else:
                split.append(members)
        unique = set(split)
        sets = [members for members in unique if not any(members < other for other in unique)]
    order = sorted(means, key=lambda key: (-means[key], key))
    rank = {key: position for position, key in enumerate(order)}
    sets.sort(key=lambda members: sorted(rank[key] for key in members))
    letters = _letters(len(sets))
    return {key: "".join(letter for letter, members in zip(letters, sets) if key in members) for key in means}


def _letters(count: int) -> list[str]:
    """a, b, ..., z, then aa, ab, ... for studies with very many cluster sizes."""
    alphabet = string.ascii_lowercase
    return [alphabet[index] if index < 26 else alphabet[index // 26 - 1] + alphabet[index % 26]
            for index in range(count)]


@dataclass(frozen=True)
class Threshold:
    """From which dataset size `workers` is significantly faster than `fewer` workers."""

    fewer: int
    workers: int
    first_size: int | None
    """The smallest size where it is significantly faster (None: at no size)."""
    from_size: int | None
    """The smallest size from which it is significantly faster at every larger size too."""


def thresholds(comparisons: Mapping[int, Sequence[Comparison]], workers: Sequence[int]) -> list[Threshold]:
    """For each worker count and the next smaller one, the sizes at which the larger one wins.

    `comparisons` maps each dataset size to its Tukey comparisons; "faster" means a significant
    difference with a lower mean time for the larger worker count.
    """
    sizes = sorted(comparisons)
    counts = sorted(workers)
    found = []
    for fewer, more in zip(counts, counts[1:]):
        wins = []
        for size in sizes:
            pair = next((c for c in comparisons[size] if (c.first, c.second) == (fewer, more)), None)
            wins.append(pair is not None and pair.significant and pair.difference < 0)
        first = next((size for size, win in zip(sizes, wins) if win), None)
        from_size = None
        for position in range(len(sizes) - 1, -1, -1):
            if not wins[position]:
                break
            from_size = sizes[position]
        found.append(Threshold(fewer, more, first, from_size))
    return found
