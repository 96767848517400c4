"""The plan's prediction beside each measured cell of a scaling study (`--profile`).

A study measures; `shoal plan` predicts. Set side by side per (dataset size, worker count), they
check the plan on the user's own cluster, and show where the model and the machines part ways.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shoal.bench.analysis import Analysis
from shoal.errors import ShoalError
from shoal.plan.predict import Layout, Prediction, predict
from shoal.plan.profile import load_profile


@dataclass
class CellPrediction:
    size: str
    rows: int
    workers: int
    nodes: int
    measured: float
    predicted: float


def predicted_measure(prediction: Prediction, measure: str, epochs: int) -> float:
    """The prediction of what trials.csv's `measure` holds (see shoal.bench.study's COLUMNS)."""
    if measure == "train_seconds":
        return epochs * prediction.epoch_seconds
    if measure == "job_seconds":  # the job after loading
        return prediction.job_seconds - prediction.startup_seconds - prediction.load_seconds
    return prediction.job_seconds


def predict_cells(study: dict, analysis: Analysis, trials: list[dict], profile_path: Path) -> list[CellPrediction]:
    """Every cell's prediction under the profile; a job whose data cannot be opened now raises ShoalError."""
    from shoal.jobs import from_dict
    from shoal.plan.calibrate import model_key_of
    from shoal.plan.planner import job_shape

    profile = load_profile(profile_path)
    job = from_dict(dict(study["job"]), name=study["job"].get("name", "job"))
    if profile.compute is None or profile.network is None:
        raise ShoalError(f"{profile_path}: the profile holds no compute or no network (save one with shoal plan)")
    if profile.compute.model != model_key_of(job):
        raise ShoalError(f"{profile_path}: its compute was measured on another model than the study's "
                         "(shoal plan JOB --save-profile PATH measures this one)")
    nodes = {(row["size"], row["workers"]): row.get("nodes") or 1 for row in trials}
    found = []
    for size in analysis.sizes:
        shape = job_shape(job, size.rows)
        for workers, cell in sorted(size.cells.items()):
            count = nodes[(size.label, workers)]
            prediction = predict(shape, Layout(count, max(workers // count, 1)), profile.compute, profile.network)
            found.append(CellPrediction(size.label, size.rows, workers, count, cell.mean,
                                        predicted_measure(prediction, analysis.measure, job.train.epochs)))
    return found


def prediction_lines(study: dict, analysis: Analysis, trials: list[dict], profile_path: Path) -> list[str]:
    """The report's section: one row per cell, or one line saying why there is none."""
    lines = ["", f"## The plan's prediction ({profile_path})", ""]
    try:
        cells = predict_cells(study, analysis, trials, profile_path)
    except ShoalError as error:
        return lines + [f"No prediction: {error}", ""]
    lines += ["| size | rows | workers | nodes | measured mean (s) | predicted (s) | predicted / measured |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {c.size} | {c.rows:,} | {c.workers} | {c.nodes} | {c.measured:,.3f} | {c.predicted:,.3f} | "
              f"{c.predicted / c.measured:.2f} |" for c in cells]
    return lines + [""]
