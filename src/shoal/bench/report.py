"""A scaling study as a document: report.md with the Parallel SGD study's tables, CSVs of the
statistics, and the plots, all from the study folder's trials.csv, so it can be remade at any time
(with another measure or significance level) without rerunning a trial."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg

from shoal.bench.analysis import Analysis, analyze
from shoal.bench.machine import machine_line
from shoal.bench.plots import MEASURE_TEXT, PLOTS
from shoal.bench.prediction import prediction_lines
from shoal.bench.study import STUDY_FILE, read_trials
from shoal.errors import ConfigError
from shoal.plan.profile import Profile
from shoal.run.report import save_atomically

REPORT_FILE = "report.md"


def write_report(out: Path, measure: str = "train_seconds", alpha: float = 0.05,
                 profile: Profile | None = None) -> Path:
    """report.md, anova.csv, anova-two-way.csv, tukey.csv and the PNG plots in the study folder; the report's
    path. With a plan's `profile`, the report also sets each cell's prediction beside its measurement."""
    out = Path(out)
    if not (out / STUDY_FILE).exists():
        raise ConfigError(f"{out}: not a scaling study folder (no {STUDY_FILE})")
    trials = read_trials(out)
    analysis = analyze(trials, measure, alpha)
    images = []
    for name, draw, caption in PLOTS:
        figure = draw(analysis)
        save_atomically(out / name, lambda path, figure=figure: FigureCanvasAgg(figure).print_png(path))
        images.append((name, caption))
    _write_csv(out / "anova.csv", ["size", "rows", "source", "df", "sum_sq", "mean_sq", "f_value", "p_value"],
               [[size.label, size.rows, row.source, row.df, row.sum_sq, row.mean_sq, row.f_value, row.p_value]
                for size in analysis.sizes for row in size.anova or []])
    _write_csv(out / "anova-two-way.csv", ["source", "df", "sum_sq", "mean_sq", "f_value", "p_value"],
               [[row.source, row.df, row.sum_sq, row.mean_sq, row.f_value, row.p_value]
                for row in analysis.two_way or []])
    _write_csv(out / "tukey.csv", ["size", "rows", "workers_a", "workers_b", "difference", "lower", "upper",
                                   "p_adjusted", "significant"],
               [[size.label, size.rows, c.first, c.second, c.difference, c.lower, c.upper, c.p_value, c.significant]
                for size in analysis.sizes for c in size.comparisons])
    study = json.loads((out / STUDY_FILE).read_text())
    text = markdown(analysis, study, images)
    if profile is not None:
        text += "\n".join(prediction_lines(study, analysis, trials, profile))
    path = out / REPORT_FILE
    save_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
    return path


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    def write(temporary: Path) -> None:
        with open(temporary, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows([["" if value is None else value for value in row] for row in rows])

    save_atomically(path, write)


def _number(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value:.{digits}g}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:,.{digits}f}"


def _p_value(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return "< 2e-16" if value < 2e-16 else f"{value:.3g}"


def _span(values: set[int]) -> str:
    return str(min(values)) if min(values) == max(values) else f"{min(values)} to {max(values)}"


def markdown(analysis: Analysis, study: dict, images: list[tuple[str, str]]) -> str:
    trials = {len(cell.values) for size in analysis.sizes for cell in size.cells.values()}
    measure = MEASURE_TEXT[analysis.measure]
    lines = [
        f"# Scaling study of `{study['job'].get('name', 'job')}`",
        "",
        f"- Machine: {machine_line(study['machine'])}" if "machine" in study else f"- Cores: {analysis.cores}",
        f"- Training set: `{study['train']}`; {len(analysis.sizes)} dataset sizes, worker counts "
        f"{', '.join(map(str, analysis.workers))}, {_span(trials)} trials per cell "
        f"(seed {study['seed']}).",
        f"- Measure: {measure} (`{analysis.measure}` in trials.csv); significance level {analysis.alpha}.",
    ]
    if analysis.hosts:
        lines.append(f"- Across machines: {analysis.hosts} (a cell's worker count is its hosts x workers per host).")
    if analysis.oversubscribed:
        lines.append(f"- **Warning**: {', '.join(map(str, analysis.oversubscribed))} workers exceed the "
                     f"{analysis.cores} cores: those workers share cores, so their times include contention.")
    lines += ["", "## Table 1: one-way ANOVA of time by worker count, per dataset size", "",
              "| size | rows | source | Df | Sum Sq | Mean Sq | F value | Pr(>F) |",
              "|---|---:|---|---:|---:|---:|---:|---:|"]
    for size in analysis.sizes:
        if size.anova is None:
            lines.append(f"| {size.label} | {size.rows:,} | ({size.note}) | | | | | |")
        for row in size.anova or []:
            lines.append(f"| {size.label} | {size.rows:,} | {row.source} | {row.df} | {_number(row.sum_sq)} | "
                         f"{_number(row.mean_sq)} | {_number(row.f_value)} | {_p_value(row.p_value)} |")
    lines += _two_way_lines(analysis)
    lines += ["", "## Table 2: Tukey's HSD groups per dataset size", "",
              "Worker counts that share a letter do not differ significantly; 'a' is the slowest group.", "",
              "| size | rows | workers | trials | mean (s) | sd (s) | speedup | group | test accuracy | test AUC |",
              "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for size in analysis.sizes:
        for count, cell in sorted(size.cells.items(), key=lambda item: -item[1].mean):
            lines.append(f"| {size.label} | {size.rows:,} | {count} | {len(cell.values)} | {_number(cell.mean)} | "
                         f"{_number(cell.deviation)} | {_number(size.speedup(count), 2)} | "
                         f"{size.letters.get(count, '-')} | {_number(cell.accuracy, 4)} | {_number(cell.auc, 4)} |")
    lines += ["", "## When more workers pay", "",
              "The smallest dataset size at which each worker count is significantly faster than the next "
              "smaller one (Tukey's HSD), and the size from which it is faster at every larger size too.", "",
              "| workers | against | first faster at | faster from |", "|---:|---:|---:|---:|"]
    for found in analysis.thresholds:
        first = "never" if found.first_size is None else f"{found.first_size:,} rows"
        from_size = "never" if found.from_size is None else f"{found.from_size:,} rows"
        lines.append(f"| {found.workers} | {found.fewer} | {first} | {from_size} |")
    lines += ["", "## Plots", ""]
    for name, caption in images:
        lines += [f"![{caption}]({name})", "", f"*{caption}*", ""]
    lines += ["Files: `trials.csv` (one row per trial), `anova.csv`, `anova-two-way.csv`, `tukey.csv` (every pair, "
              "adjusted p).", ""]
    return "\n".join(lines)


def _two_way_lines(analysis: Analysis) -> list[str]:
    """Table 1b: size, worker count and their interaction over every trial."""
    lines = ["", "## Table 1b: two-way ANOVA of time by dataset size and worker count, with interaction", "",
             "Type II sums of squares over every trial: does the worker count matter once the size is accounted "
             "for, and does its effect change with the size (the interaction)?", ""]
    if analysis.two_way is None:
        return [*lines, f"Not computed: {analysis.two_way_note}."]
    lines += ["| source | Df | Sum Sq | Mean Sq | F value | Pr(>F) |", "|---|---:|---:|---:|---:|---:|"]
    for row in analysis.two_way:
        lines.append(f"| {row.source} | {row.df} | {_number(row.sum_sq)} | {_number(row.mean_sq)} | "
                     f"{_number(row.f_value)} | {_p_value(row.p_value)} |")
    return lines
