"""Today's planning model against every committed `benchmarks.plan` measurement, in seconds.

A run of `benchmarks.plan` takes 35-70 minutes, and on a VM one run's score moves by a quarter
from one evening to the next, so a change to the model cannot be judged by one fresh run. Each
result keeps what it measured: the link's profiles (one per calibration) and every run of every
job. This script plans each measured job again from those profiles, as `benchmarks.plan` does
(the median profile, then the job's prediction), with the model as it is now, and scores it
against the same median run. The epochs were measured by the shoal of their day; only the
model is today's. Results measured before profiles were kept per calibration are left out.

It also measures the measurement: each result's passes split in two (odd and even), each half's
median run taken as a measurement of the same job in the same hour, and scored against the other
half's and against today's model planned from the half's own calibrations. No model can be shown
closer to the measurement than the measurement repeats.

    .venv/bin/python -m benchmarks.plan_replay             # writes benchmarks/results/<date>-...-plan-replay.md
    .venv/bin/python -m benchmarks.plan_replay --print     # the same, printed only
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
from pathlib import Path

from benchmarks.common import RESULTS, machine_line, write_result
from benchmarks.plan import GOAL, MODELS, error_at_pace, scored
from shoal.algorithms import options_class
from shoal.config import drop_none
from shoal.plan.median import median_profile
from shoal.plan.predict import Layout, Prediction, Shape, predict
from shoal.plan.profile import Profile, profile_from

INPUTS, CLASSES = 784, 10  # benchmarks.plan's digits


def parameters(model: str) -> int:
    """Weights and biases of benchmarks.plan's model `model` (784-hidden-10)."""
    hidden = MODELS[model]
    return INPUTS * hidden + hidden + hidden * CLASSES + CLASSES


def shape_of(row: dict) -> Shape:
    """The planner's view of a measured row's job (benchmarks.plan.write_job: no test set, an evaluation each
    epoch, the algorithm's default options). Its epoch count is write_job's default: no epoch's seconds hang on it."""
    options = drop_none(dataclasses.asdict(options_class(row["algorithm"])()))
    hidden = MODELS[row["model"]]
    shapes = ((hidden, INPUTS), (hidden,), (CLASSES, hidden), (CLASSES,))  # what PowerSGD could factor
    return Shape(parameters=parameters(row["model"]), buffers=0, rows=row["rows"], test_rows=0, batch=row["batch"],
                 epochs=3, eval_every=1, algorithm=row["algorithm"], options=options, parameter_shapes=shapes)


def profiles_of(result: Path, results: list[dict]) -> dict[tuple[str, str], list]:
    """(link, model) -> its calibrations' profiles, in the order measured, each named for error messages."""
    found: dict[tuple[str, str], list] = {}
    for entry in results:
        if "profile" in entry and "calibration" in entry:
            where = Path(f"{result}: {entry['rate']} {entry['model']} calibration {entry['calibration']}")
            found.setdefault((entry["rate"], entry["model"]), []).append((where, profile_from(entry["profile"], where)))
    return found


def replayed(result: Path) -> list[dict] | None:
    """Each measured row of `result` with today's prediction and error; None without per-calibration profiles."""
    results = json.loads(result.read_text())["results"]
    profiles = profiles_of(result, results)
    if not profiles:
        return None
    first_link = next(iter(profiles))[0]  # one-host rows ran on the first link's cluster, with its calibrations
    medians = {key: Medians(calibrations) for key, calibrations in profiles.items()}
    rows = []
    for row in (row for row in results if "error" in row):
        median = medians[(first_link if row["rate"] == "-" else row["rate"], row["model"])]
        now = planned(row, median.every)
        rows.append({**row, "replayed": now.epoch_seconds, "replayed_error": now.epoch_seconds / row["measured"] - 1,
                     **at_pace(row, now), **by_halves(row, median)})
    return rows


class Medians:
    """A link's calibrations of a model, combined as benchmarks.plan combines them: all of them, and (for the
    benchmark done twice) its odd passes' apart from its even ones'. Each median is taken once, when first asked."""

    def __init__(self, calibrations: list):
        self.calibrations = calibrations

    @functools.cached_property
    def every(self) -> Profile:
        return median_profile(self.calibrations)

    @functools.cached_property
    def halves(self) -> tuple[Profile, Profile]:
        return median_profile(self.calibrations[0::2]), median_profile(self.calibrations[1::2])


def planned(row: dict, profile: Profile) -> Prediction:
    """Today's prediction of `row`'s job from `profile`, as benchmarks.plan plans."""
    return predict(shape_of(row), Layout(row["nodes"], 1), profile.compute, profile.network)


def by_halves(row: dict, median: Medians) -> dict:
    """For a job run after every calibration (at least FEWEST_RUNS), the benchmark done twice: the alternate
    passes' calibrations planned and their runs measured, odd passes apart from even ones."""
    runs = row.get("runs", [])
    if len(runs) < FEWEST_RUNS or len(runs) != len(median.calibrations):
        return {}
    return {"half_predictions": [planned(row, half).epoch_seconds for half in median.halves],
            "half_measurements": [statistics.median(runs[0::2]), statistics.median(runs[1::2])]}


def at_pace(row: dict, now: Prediction) -> dict:
    """Today's error with its compute at the pace the row's median run showed (rows measured since the benchmark
    timed it): benchmarks.plan.compared's score, with today's prediction."""
    if "pace" not in row:
        return {}
    return {"replayed_error_at_pace": error_at_pace(now.compute_seconds, now.communication_seconds, row)}


def score(errors: list[float]) -> str:
    within, median, largest = scored(errors)
    return f"{within}/{len(errors)} | {median:.1%} | {largest:.1%}"


def unchanged(rows: list[dict]) -> str:
    """How many of today's predictions are the ones made then (to a millionth): 'all' for a result measured
    under today's model."""
    same = sum(abs(row["replayed"] / row["predicted"] - 1) < 1e-6 for row in rows)
    return "all" if same == len(rows) else f"{same}/{len(rows)}"


def report(replays: dict[str, list[dict]]) -> str:
    lines = ["| result | rows | then: within 15% | median | largest | today's model: within 15% | median | largest "
             "| predictions unchanged |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, rows in replays.items():
        then, now = score([row["error"] for row in rows]), score([row["replayed_error"] for row in rows])
        lines.append(f"| {name} | {len(rows)} | {then} | {now} | {unchanged(rows)} |")
    every = [row for rows in replays.values() for row in rows]
    lines.append(f"| **all** | {len(every)} | {score([row['error'] for row in every])} | "
                 f"{score([row['replayed_error'] for row in every])} | {unchanged(every)} |")
    return "\n".join(lines)


KINDS = {"one host": lambda row: row["nodes"] == 1,
         "two hosts, sync": lambda row: row["nodes"] == 2 and row["algorithm"] == "sync",
         "two hosts, averaging": lambda row: row["nodes"] == 2 and row["algorithm"] == "averaging",
         "two hosts, downpour": lambda row: row["algorithm"] == "downpour",
         # the same two-host rows again, by link: mostly transfer on the slow links, mostly compute on the fast one
         "two hosts, 10 or 100 Mbit/s": lambda row: row["rate"] in ("10mbit", "100mbit"),
         "two hosts, 1 Gbit/s": lambda row: row["rate"] == "1gbit"}
FEWEST_RUNS = 4  # a row's runs split in two halves of at least two


def by_kind(replays: dict[str, list[dict]]) -> str:
    """Today's errors by kind of row: where the model is biased, the mean shows it; where the machine is, the
    spread does."""
    every = [row for rows in replays.values() for row in rows]
    lines = ["| rows | count | mean error | within 15% |", "| --- | ---: | ---: | ---: |"]
    for kind, chosen in KINDS.items():
        errors = [row["replayed_error"] for row in every if chosen(row)]
        if errors:
            lines.append(f"| {kind} | {len(errors)} | {statistics.mean(errors):+.1%} | "
                         f"{sum(abs(error) <= GOAL for error in errors)}/{len(errors)} |")
    return "\n".join(lines)


def within(guess: float, measured: float) -> bool:
    return abs(guess / measured - 1) <= GOAL


def against_itself(replays: dict[str, list[dict]]) -> str:
    """The benchmark done twice within each result (odd passes, even passes), each half's median run taken as the
    measurement: the other half's median run as a prediction (how far the measurement repeats), and today's model
    planned from the half's own calibrations (the benchmark's score). A model cannot be judged more finely than
    the measurement repeats."""
    split = {name: [row for row in rows if "half_predictions" in row] for name, rows in replays.items()}
    every = [row for rows in split.values() for row in rows]
    if not every:
        return "No result has rows run after every calibration, four or more times, yet."
    lines = ["| rows | count | the other half's median run within 15% | today's model from the half's calibrations "
             "within 15% |", "| --- | ---: | ---: | ---: |"]
    for kind, chosen in [*KINDS.items(), ("**all**", lambda row: True)]:
        rows = [row for row in every if chosen(row)]
        if rows:
            lines.append(f"| {kind} | {len(rows)} | {_half_score(rows, repeat=True)} | "
                         f"{_half_score(rows, repeat=False)} |")
    measured = [name for name, rows in split.items() if rows]
    steady = [name for name in measured if all(_agree(row, repeat=True) == 2 for row in split[name])]
    return ("\n".join(lines) + f"\n\nResults in which every row's two halves agree within 15% both ways: "
            f"{len(steady)} of {len(measured)}{' (' + ', '.join(steady) + ')' if steady else ''}.")


def _agree(row: dict, repeat: bool) -> int:
    """Of the row's two halves, how many are within GOAL of their guess: the other half's median run (`repeat`),
    or today's model planned from the half's own calibrations."""
    measured = row["half_measurements"]
    guesses = measured[::-1] if repeat else row["half_predictions"]
    return sum(within(guess, actual) for guess, actual in zip(guesses, measured))


def _half_score(rows: list[dict], repeat: bool) -> str:
    hits = sum(_agree(row, repeat) for row in rows)
    return f"{hits}/{2 * len(rows)} ({hits / (2 * len(rows)):.0%})"


def paced(replays: dict[str, list[dict]]) -> str:
    """Today's score over the rows whose runs were timed for pace, plainly and at that pace."""
    rows = [row for found in replays.values() for row in found if "replayed_error_at_pace" in row]
    if not rows:
        return "No result has runs timed for pace yet."
    return (f"Rows whose median run was timed for pace: {len(rows)}. Today's model on them, within 15% | median | "
            f"largest: {score([row['replayed_error'] for row in rows])} as measured; "
            f"{score([row['replayed_error_at_pace'] for row in rows])} at the pace their hosts showed.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--print", action="store_true", help="print the report, write no result")
    args = parser.parse_args(argv)
    replays, skipped = {}, []
    for result in sorted(RESULTS.glob("*-plan*.json")):
        if "replay" in result.stem:
            continue
        rows = replayed(result)
        if rows is None:
            skipped.append(result.stem)
        else:
            replays[result.stem] = rows
    markdown = f"""# shoal plan's model today, against every committed `benchmarks.plan` measurement

{machine_line()} (where this replay ran; the measurements' machines are in their results).
Each row of each result planned again from that result's own profiles (their median, as
`benchmarks.plan` plans) with today's `shoal.plan.predict`, against the same measured median run.
`.venv/bin/python -m benchmarks.plan_replay`

{report(replays)}

Today's errors by kind of row (all results; negative: under-predicted):

{by_kind(replays)}

{paced(replays)}

The measurement against itself: each result's benchmark split in two, its odd passes (each a calibration and a
run of every short job) apart from its even ones, for the jobs run in every pass ({FEWEST_RUNS} or more times). Each
half's median run is taken in turn as the measurement: the other half's median run is a second measurement of the
same job in the same hour, and today's model is planned from the half's own calibrations' median.

{against_itself(replays)}

Left out (profiles not kept per calibration): {", ".join(skipped) or "none"}.
"""
    if args.print:
        print(markdown)
        return
    path = write_result("plan-replay", markdown, {"results": {name: rows for name, rows in replays.items()}})
    print(markdown)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
