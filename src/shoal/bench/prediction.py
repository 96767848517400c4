"""The plan's prediction beside each measured cell of a scaling study (`--profile`).

A study measures; `shoal plan` predicts. Set side by side per (dataset size, worker count), they
check the plan on the user's own cluster, and show where the model and the machines part ways.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.bench.analysis import Analysis
from shoal.errors import ShoalError
from shoal.plan.predict import Layout, Prediction, predict
from shoal.plan.profile import Profile


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


def study_job(study: dict):
    """The study's job as it trains; study.json leaves data.train out (trials set it), so it comes back here."""
    from shoal.jobs import from_dict

    raw = dict(study["job"])
    raw["data"] = {**raw.get("data", {}), "train": study["train"]}
    return from_dict(raw, name=raw.get("name", "job"))


def predict_cells(study: dict, analysis: Analysis, trials: list[dict], profile: Profile) -> list[CellPrediction]:
    """Every cell's prediction under the profile; a job whose data cannot be opened now raises ShoalError."""
    from shoal.plan.calibrate import model_key_of
    from shoal.plan.planner import job_shape

    job = study_job(study)
    if profile.compute is None or profile.network is None:
        raise ShoalError("the profile holds no compute or no network (save one with shoal plan)")
    if profile.compute.model != model_key_of(job):
        raise ShoalError("the profile's compute was measured on another model than the study's "
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


def prediction_lines(study: dict, analysis: Analysis, trials: list[dict], profile: Profile) -> list[str]:
    """The report's section: one row per cell, or one line saying why there is none."""
    lines = ["", f"## The plan's prediction ({profile.network.source if profile.network else 'no network'})", ""]
    try:
        cells = predict_cells(study, analysis, trials, profile)
    except ShoalError as error:
        return lines + [f"No prediction: {error}", ""]
    lines += ["| size | rows | workers | nodes | measured mean (s) | predicted (s) | predicted / measured |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {c.size} | {c.rows:,} | {c.workers} | {c.nodes} | {c.measured:,.3f} | {c.predicted:,.3f} | "
              f"{c.predicted / c.measured:.2f} |" for c in cells]
    return lines + [""]
