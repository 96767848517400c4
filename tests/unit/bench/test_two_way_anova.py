"""The two-way ANOVA (size x nodes, with interaction) on tables of known effects, against statsmodels."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from statsmodels.formula.api import ols
from statsmodels.stats.anova import anova_lm

from shoal.bench.statistics import two_way_anova

SIZES = [1_000, 10_000, 100_000]
NODES = [1, 2, 4, 8]


def table(interaction: float, trials: int = 5, seed: int = 0, noise: float = 0.5) -> list[tuple[int, int, float]]:
    """Training times: a strong size effect, a nodes effect, and `interaction` x (log size x log nodes)."""
    generator = np.random.default_rng(seed)
    rows = []
    for size in SIZES:
        for nodes in NODES:
            mean = 2.0 * math.log10(size) + 3.0 / nodes + interaction * math.log10(size) * math.log2(nodes)
            rows += [(size, nodes, float(mean + generator.normal(0, noise))) for _ in range(trials)]
    return rows


def reference(rows: list[tuple[int, int, float]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["size", "nodes", "seconds"])
    return anova_lm(ols("seconds ~ C(size) * C(nodes)", frame).fit(), typ=2)


@pytest.mark.parametrize("drop", [0, 3], ids=["balanced", "unbalanced"])
def test_two_way_anova_matches_statsmodels_type_2(drop):
    rows = table(interaction=0.4)
    rows = rows[:-drop] if drop else rows  # the last cell keeps 2 trials of 5: Type II sums differ from Type I's
    expected = reference(rows)
    found = {row.source: row for row in two_way_anova(rows, ("size", "nodes"))}
    assert list(found) == ["size", "nodes", "size:nodes", "Residuals"]
    for ours, theirs in [("size", "C(size)"), ("nodes", "C(nodes)"), ("size:nodes", "C(size):C(nodes)"),
                         ("Residuals", "Residual")]:
        assert found[ours].df == expected.loc[theirs, "df"]
        assert found[ours].sum_sq == pytest.approx(expected.loc[theirs, "sum_sq"], rel=1e-9)
        if ours != "Residuals":
            assert found[ours].f_value == pytest.approx(expected.loc[theirs, "F"], rel=1e-9)
            assert found[ours].p_value == pytest.approx(expected.loc[theirs, "PR(>F)"], rel=1e-6, abs=1e-300)


def test_known_effects_are_found_and_an_absent_interaction_is_not():
    without = {row.source: row for row in two_way_anova(table(interaction=0.0, trials=20, seed=3))}
    assert without["size"].p_value < 1e-10 and without["workers"].p_value < 1e-10
    assert without["size:workers"].p_value > 0.01
    with_interaction = {row.source: row for row in two_way_anova(table(interaction=0.6, trials=20, seed=3))}
    assert with_interaction["size:workers"].p_value < 1e-6
    assert (without["size"].df, without["workers"].df, without["size:workers"].df) == (2, 3, 6)
    assert without["Residuals"].df == len(SIZES) * len(NODES) * 19


def test_an_exact_fit_gives_infinite_f_where_a_term_explains_anything():
    rows = [(size, nodes, float(size + nodes)) for size in (1, 2) for nodes in (1, 2) for _ in range(3)]
    found = {row.source: row for row in two_way_anova(rows)}
    assert found["Residuals"].sum_sq == 0.0
    assert found["size"].f_value == math.inf and found["size"].p_value == 0.0
    assert math.isnan(found["size:workers"].f_value)  # an additive table: the interaction explains nothing


def test_one_level_or_one_trial_per_cell_is_refused():
    with pytest.raises(ValueError, match="two levels of each factor"):
        two_way_anova([(1, nodes, float(nodes)) for nodes in (1, 2) for _ in range(3)])
    with pytest.raises(ValueError, match="several trials per cell"):
        two_way_anova([(size, nodes, float(size * nodes)) for size in (1, 2) for nodes in (1, 2)])
