"""The scaling study's statistics against statsmodels, letter groups, thresholds and the report (no processes)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from statsmodels.formula.api import ols
from statsmodels.stats.anova import anova_lm
from statsmodels.stats.multicomp import pairwise_tukeyhsd

from shoal.bench.analysis import analyze
from shoal.bench.report import write_report
from shoal.bench.statistics import Comparison, letter_groups, one_way_anova, thresholds, tukey_hsd
from shoal.bench.study import COLUMNS, STUDY_FILE, read_trials, write_trials
from shoal.errors import ConfigError

# Training seconds of 17 trials on four cluster sizes, unequal trial counts.
TIMES = {1: [10.2, 11.1, 9.8, 10.5, 10.9], 2: [6.1, 5.7, 6.6, 6.0], 4: [5.9, 6.4, 5.5, 6.8, 6.2], 8: [7.9, 8.3, 7.4]}


def frame(groups: dict[int, list[float]]) -> pd.DataFrame:
    return pd.DataFrame([(count, value) for count, values in groups.items() for value in values],
                        columns=["workers", "seconds"])


def test_anova_matches_statsmodels():
    reference = anova_lm(ols("seconds ~ C(workers)", frame(TIMES)).fit())
    factor, residuals = one_way_anova(TIMES)
    assert (factor.source, factor.df, residuals.source, residuals.df) == ("workers", 3, "Residuals", 13)
    expected = reference.loc["C(workers)"]
    assert factor.sum_sq == pytest.approx(expected["sum_sq"], rel=1e-10)
    assert factor.mean_sq == pytest.approx(expected["mean_sq"], rel=1e-10)
    assert factor.f_value == pytest.approx(expected["F"], rel=1e-10)
    assert factor.p_value == pytest.approx(expected["PR(>F)"], rel=1e-8)
    assert residuals.sum_sq == pytest.approx(reference.loc["Residual", "sum_sq"], rel=1e-10)
    assert residuals.mean_sq == pytest.approx(reference.loc["Residual", "mean_sq"], rel=1e-10)


def test_tukey_matches_statsmodels():
    data = frame(TIMES)
    reference = pairwise_tukeyhsd(data["seconds"], data["workers"], alpha=0.05)
    comparisons = tukey_hsd(TIMES, alpha=0.05)
    assert [(c.first, c.second) for c in comparisons] == [(1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (4, 8)]
    np.testing.assert_allclose([c.difference for c in comparisons], reference.meandiffs, rtol=1e-10)
    np.testing.assert_allclose([[c.lower, c.upper] for c in comparisons], reference.confint, rtol=1e-4)
    np.testing.assert_allclose([c.p_value for c in comparisons], reference.pvalues, rtol=1e-4, atol=1e-9)
    assert [c.significant for c in comparisons] == list(reference.reject)
    assert [c.significant for c in comparisons] == [True, True, True, False, True, True]


def test_anova_edge_cases():
    factor, residuals = one_way_anova({1: [3.0], 2: [2.0]})  # one trial each: nothing to test against
    assert residuals.df == 0 and math.isnan(factor.f_value) and math.isnan(factor.p_value)
    factor, _ = one_way_anova({1: [3.0, 3.0], 2: [2.0, 2.0]})  # no spread, different means
    assert factor.f_value == math.inf and factor.p_value == 0.0
    with pytest.raises(ValueError):
        one_way_anova({1: [3.0, 4.0]})


def comparisons_from(significant: set[tuple[int, int]], keys: list[int]) -> list[Comparison]:
    return [Comparison(a, b, 0.0, 0.0, 0.0, 0.01 if (a, b) in significant else 0.5, (a, b) in significant)
            for index, a in enumerate(keys) for b in keys[index + 1:]]


@pytest.mark.parametrize(("significant", "expected"), [
    (set(), {1: "a", 2: "a", 3: "a"}),
    ({(1, 2), (1, 3), (2, 3)}, {1: "a", 2: "b", 3: "c"}),
    ({(1, 3)}, {1: "a", 2: "ab", 3: "b"}),  # the middle one is like both ends
])
def test_letter_groups_of_three(significant, expected):
    means = {1: 30.0, 2: 20.0, 3: 10.0}  # 'a' for the largest mean: the slowest
    assert letter_groups(means, comparisons_from(significant, [1, 2, 3])) == expected


def test_letter_groups_of_four_overlapping():
    # means fall with the worker count; 1 differs from 4 and 8, 2 differs from 8 (Piepho's insert-absorb)
    means = {1: 40.0, 2: 30.0, 4: 20.0, 8: 10.0}
    letters = letter_groups(means, comparisons_from({(1, 4), (1, 8), (2, 8)}, [1, 2, 4, 8]))
    assert letters == {1: "a", 2: "ab", 4: "bc", 8: "c"}
    # every pair shares a letter exactly when it is not significantly different
    differ = {(1, 4), (1, 8), (2, 8)}
    for a in means:
        for b in means:
            if a < b:
                assert (not set(letters[a]) & set(letters[b])) == ((a, b) in differ)


def test_thresholds_find_the_first_size_and_the_size_from_which_more_workers_win():
    def pair(first, second, difference, significant):
        return Comparison(first, second, difference, 0.0, 0.0, 0.01 if significant else 0.5, significant)

    by_size = {
        1_000: [pair(1, 2, +1.0, True), pair(1, 4, +2.0, True), pair(2, 4, +1.0, True)],  # more is slower
        10_000: [pair(1, 2, -1.0, True), pair(1, 4, -0.5, False), pair(2, 4, +0.5, False)],
        100_000: [pair(1, 2, -0.2, False), pair(1, 4, -3.0, True), pair(2, 4, -2.0, True)],
        1_000_000: [pair(1, 2, -5.0, True), pair(1, 4, -9.0, True), pair(2, 4, -4.0, True)],
    }
    found = {(t.fewer, t.workers): (t.first_size, t.from_size) for t in thresholds(by_size, [1, 2, 4])}
    assert found == {(1, 2): (10_000, 1_000_000), (2, 4): (100_000, 100_000)}
    assert [(t.first_size, t.from_size) for t in thresholds({1_000: by_size[1_000]}, [1, 2])] == [(None, None)]


def trial_rows() -> list[dict]:
    """Fabricated trials of two sizes: TIMES at the larger, no difference at the smaller."""
    rows = []
    for label, count_rows, groups in (("1:1", 2_000, {1: [1.0, 1.2, 1.1], 2: [1.1, 1.0, 1.2]}),
                                      ("1:10", 11_000, TIMES)):
        for workers, values in groups.items():
            for trial, seconds in enumerate(values, start=1):
                rows.append({"size": label, "rows": count_rows, "workers": workers, "trial": trial, "threads": 1,
                             "cores": 2, "train_seconds": seconds, "job_seconds": seconds + 0.5,
                             "load_seconds": 0.1, "wall_seconds": seconds + 4, "compute_seconds": seconds * 0.7,
                             "communication_seconds": seconds * 0.2, "data_seconds": seconds * 0.05,
                             "evaluation_seconds": seconds * 0.05, "epochs": 2, "samples_per_second": 1e4,
                             "train_loss": 0.3, "test_loss": 0.31, "test_accuracy": 0.9, "test_auc": None,
                             "run_dir": f"runs/{label}/w{workers}-t{trial}", "finished": "2026-11-22T12:00:00+00:00",
                             "nodes": 1, "hosts": "", "trainers": workers})
    return rows


def test_report_from_trials_csv(tmp_path):
    write_trials(tmp_path, trial_rows())
    assert read_trials(tmp_path) == trial_rows()  # numbers, text and empty cells survive the CSV
    with pytest.raises(ConfigError, match="not a scaling study folder"):
        write_report(tmp_path)
    (tmp_path / STUDY_FILE).write_text('{"job": {"name": "claims"}, "train": "data/claims", "seed": 0, '
                                       '"machine": {"cores": 2, "memory_gib": 23.5, "cpu": "a CPU", '
                                       '"torch": "2.13.0", "python": "3.11"}}')
    report = write_report(tmp_path).read_text()
    reference = anova_lm(ols("seconds ~ C(workers)", frame(TIMES)).fit())
    f_value = reference.loc["C(workers)", "F"]
    assert f"| 1:10 | 11,000 | workers | 3 | {reference.loc['C(workers)', 'sum_sq']:,.3f} |" in report
    assert f"{f_value:,.3f} |" in report and "| 1:10 | 11,000 | Residuals | 13 |" in report
    assert "| 1:10 | 11,000 | 1 | 5 | 10.500 |" in report  # the slowest first, group 'a'
    assert "2 cores, 23.5 GiB, a CPU" in report and "4, 8 workers exceed the 2 cores" in report
    # 2 workers first beat 1 at 11,000 rows; 4 never beats 2 (no significant difference)
    assert "| 2 | 1 | 11,000 rows | 11,000 rows |" in report and "| 4 | 2 | never | never |" in report
    anova = pd.read_csv(tmp_path / "anova.csv")
    assert list(anova["source"]) == ["workers", "Residuals", "workers", "Residuals"]
    assert anova.loc[2, "f_value"] == pytest.approx(f_value)
    tukey = pd.read_csv(tmp_path / "tukey.csv")
    assert len(tukey) == 1 + 6 and not tukey.loc[0, "significant"]
    # the two-way table over both sizes: 2 sizes, 4 worker counts, 6 of 8 cells filled, 23 trials
    two_way = pd.read_csv(tmp_path / "anova-two-way.csv")
    assert list(two_way["source"]) == ["size", "workers", "size:workers", "Residuals"]
    assert list(two_way["df"]) == [1, 3, 1, 17]
    assert "## Table 1b: two-way ANOVA" in report and "| size:workers | 1 |" in report
    for name in ("time_by_size.png", "time_by_workers.png", "boxes.png", "speedup.png", "split.png", "load.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / name).stat().st_size > 5000
    analysis = analyze(read_trials(tmp_path), "wall_seconds")
    assert analysis.sizes[1].cells[1].mean == pytest.approx(np.mean(TIMES[1]) + 4)
    assert analysis.sizes[1].letters == {1: "a", 8: "b", 2: "c", 4: "c"}


def test_bad_trials_and_options_name_the_culprit(tmp_path):
    write_trials(tmp_path, trial_rows())
    text = (tmp_path / "trials.csv").read_text().splitlines()
    text[3] = text[3].replace(",1.1,", ",fast,", 1)
    (tmp_path / "trials.csv").write_text("\n".join(text) + "\n")
    with pytest.raises(ConfigError, match=r"trials.csv:4: not a number"):
        read_trials(tmp_path)
    (tmp_path / "trials.csv").write_text("size,rows\n")
    with pytest.raises(ConfigError, match="not a shoal study's trials"):
        read_trials(tmp_path)
    with pytest.raises(ConfigError, match="--measure"):
        analyze(trial_rows(), "seconds")
    with pytest.raises(ConfigError, match="--alpha"):
        analyze(trial_rows(), alpha=1.5)
    assert set(COLUMNS) >= {"train_seconds", "communication_seconds", "workers", "trial"}
