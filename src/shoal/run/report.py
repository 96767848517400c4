"""A finished (or running) job as a document: RUN_DIR/report.md plus three PNG plots.

Like `shoal status`, it reads only `events.jsonl`, so it can be made for any run, anywhere,
at any time. The plots show what the literature shows for these systems: loss and accuracy
per epoch, where each epoch's time went (cNeural's Fig. 8), and each worker's pace (with each
machine's rows per second and share of the rows, on machines of different speeds). A job whose
machines changed (`--nnodes MIN:MAX`) gets a table of its machines over time, and its epochs may
have different numbers of workers: no table or plot assumes one count.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from shoal.events import (
    SPLIT_PARTS,
    Checkpoint,
    DataLoaded,
    EpochEnd,
    History,
    JobRestarted,
    JobResumed,
    JobStart,
    Membership,
    WorkerFailed,
    known_host,
    read_history,
)
from shoal.run.status import (
    NOT_STARTED,
    balance_text,
    end_message,
    host_text,
    machine_paces,
    machines_text,
    next_rows_text,
    run_state,
    shares_differ,
    shares_text,
    worker_paces,
)
from shoal.safe_files import new_temporary, refuse_link

REPORT_FILE = "report.md"
LOSS = "loss"
METRIC_ORDER = (LOSS, "accuracy", "auc")


def write_report(run_dir: str | Path) -> Path:
    """Write report.md and its plots into the run directory; the report's path."""
    run_dir = Path(run_dir)
    history = read_history(run_dir)
    epochs = history.latest_epochs()
    images = []
    if epochs:  # no epoch, nothing to draw
        for name, draw, caption in PLOTS:
            figure = draw(epochs)
            save_atomically(run_dir / name, lambda path, figure=figure: FigureCanvasAgg(figure).print_png(path))
            images.append((name, caption))
    path = run_dir / REPORT_FILE
    text = markdown(run_dir, history, images)
    save_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
    return path


def save_atomically(path: Path, write) -> None:
    """`write(temporary)` then rename: a reader never sees half a file, a crash leaves the old one.

    The temporary is new, with an unpredictable name; a link at `path` is refused, not replaced."""
    refuse_link(path)
    descriptor, temporary = new_temporary(path)
    os.close(descriptor)
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def metric_names(epochs: list[EpochEnd]) -> list[str]:
    """Test metrics seen in any epoch: loss, accuracy, auc first, then any others."""
    seen = {key for record in epochs for key in record.test}
    return [key for key in METRIC_ORDER if key in seen] + sorted(seen - set(METRIC_ORDER))


# ---------------------------------------------------------------- plots


def new_figure(panels: int = 1) -> tuple[Figure, list]:
    figure = Figure(figsize=(6.4 * panels, 4.2), layout="constrained")
    axes = [figure.add_subplot(1, panels, index + 1) for index in range(panels)]
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    return figure, axes


def plot_loss(epochs: list[EpochEnd]) -> Figure:
    """Train and test loss per epoch; accuracy and AUC in a second panel when there are any."""
    others = [name for name in metric_names(epochs) if name != LOSS]
    figure, axes = new_figure(2 if others else 1)
    numbers = [record.epoch for record in epochs]
    axes[0].plot(numbers, [record.train_loss for record in epochs], marker="o", label="train loss")
    tested = [record for record in epochs if LOSS in record.test]
    if tested:  # with eval_every > 1 some epochs have no test metrics
        axes[0].plot([r.epoch for r in tested], [r.test[LOSS] for r in tested], marker="s", label="test loss")
    axes[0].set_ylabel("loss")
    axes[0].set_title("loss")
    axes[0].legend()
    if others:
        for name in others:
            scored = [record for record in epochs if name in record.test]
            axes[1].plot([r.epoch for r in scored], [r.test[name] for r in scored], marker="o", label=name)
        axes[1].set_ylabel("test metric")
        axes[1].set_title("test metrics")
        axes[1].legend()
    return figure


def plot_time_split(epochs: list[EpochEnd]) -> Figure:
    """Per-epoch stacked bars of compute, communication, data and evaluation seconds."""
    figure, (ax,) = new_figure()
    numbers = [record.epoch for record in epochs]
    bottom = [0.0] * len(epochs)
    for part in SPLIT_PARTS:
        heights = [record.seconds_split.parts()[part] for record in epochs]
        ax.bar(numbers, heights, bottom=bottom, label=part)
        bottom = [low + height for low, height in zip(bottom, heights)]
    ax.set_ylabel("seconds (mean over workers)")
    ax.set_title("where each epoch's time went")
    handles, labels = ax.get_legend_handles_labels()
    # beside the bars, top part first, as stacked: inside, it would cover the tallest bar
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure


def plot_workers(epochs: list[EpochEnd]) -> Figure:
    """Each worker's steps per second per epoch: a straggler is the line below the others. Where the records
    hold rates and shares, two more panels: each machine's rows per second and its share of the rows."""
    machines = machine_epochs(epochs) if shows_machines(epochs) else {}
    figure, axes = new_figure(3 if machines else 1)
    ax = axes[0]
    paces = worker_series(epochs)
    for (rank, host), points in paces.items():
        ax.plot([epoch for epoch, _ in points], [rate for _, rate in points], marker="o",
                label=f"rank {rank}{host_text(host)}")
    ax.set_ylabel("steps per second")
    ax.set_title("worker pace")
    if paces:  # a record without workers draws none
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), ncols=1 + len(paces) // 16, fontsize="small")
    if machines:
        plot_machines(machines, axes[1], axes[2])
    return figure


def worker_series(epochs: list[EpochEnd]) -> dict[tuple[int, str], list[tuple[int, float]]]:
    """(rank, host) -> (epoch, steps per second) for each epoch, by rank: after a change of machines a rank
    may be another machine's, and a worker may be gone for some epochs (NaN there, so its line breaks
    instead of joining epochs it did not train)."""
    series: dict[tuple[int, str], dict[int, float]] = {}
    for record in epochs:
        for worker in record.workers:
            series.setdefault((worker.rank, worker.host), {})[record.epoch] = worker.steps_per_second
    return {key: with_gaps(series[key], epochs) for key in sorted(series)}


def with_gaps(values: dict[int, float], epochs: list[EpochEnd]) -> list[tuple[int, float]]:
    """The epochs from the first to the last with a value, NaN where a record holds none."""
    numbers = [record.epoch for record in epochs]
    held = [index for index, epoch in enumerate(numbers) if epoch in values]
    return [(epoch, values.get(epoch, math.nan)) for epoch in numbers[held[0]:held[-1] + 1]]


def plot_machines(machines: dict[str, list[tuple[int, float | None, float | None]]], rates, shares) -> None:
    """Each machine's rows per second and share of the rows per epoch (an unknown figure is left out; a
    machine out of the job for some epochs has a gap there)."""
    numbers = sorted({point[0] for points in machines.values() for point in points})
    for host, points in machines.items():
        held = {point[0] for point in points}
        absent = [(epoch, math.nan) for epoch in numbers if points[0][0] < epoch < points[-1][0] and epoch not in held]
        for ax, column in ((rates, 1), (shares, 2)):
            known_points = sorted([(point[0], point[column]) for point in points if point[column] is not None]
                                  + absent, key=lambda point: point[0])
            ax.plot([epoch for epoch, _ in known_points], [value for _, value in known_points], marker="o",
                    label=host)
    rates.set_ylabel("rows per second (own work)")
    rates.set_title("machine rate")
    shares.set_ylabel("share of the rows")
    shares.set_title("machine share")
    shares.yaxis.set_major_formatter(PercentFormatter(1.0))
    shares.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), ncols=1 + len(machines) // 16, fontsize="small")


PLOTS = (
    ("loss.png", plot_loss, "loss and test metrics per epoch"),
    ("time_split.png", plot_time_split, "where each epoch's time went"),
    ("workers.png", plot_workers, "steps per second of each worker (and each machine's rate and share)"),
)


# ---------------------------------------------------------------- markdown


def number(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def markdown(run_dir: Path, history: History, images: list[tuple[str, str]]) -> str:
    """The report's text: how the job ended, the job, its epochs, its incidents, its plots."""
    epochs = history.latest_epochs()
    start = history.start or next((event for event in reversed(history.events) if isinstance(event, JobStart)),
                                  None)  # a job_start without the job's name still holds the rest
    lines = [f"# shoal report: {start and start.job or run_dir.name}", "", outcome(history), ""]
    membership = history.of(Membership)
    changed = len(membership) > 1
    lines += ["## Job", "", *table(["", ""], job_rows(run_dir, start, history.last(DataLoaded), changed)), ""]
    lines += ["## Epochs", "", *epoch_table(epochs)]
    if shows_machines(epochs):
        lines += ["## Machines", "", *machine_table(epochs)]
    if any(shares_differ(record) for record in epochs):
        lines += ["## Shares", "", *shares_table(epochs)]
    if changed:
        lines += ["## Machines over time", "", *membership_table(membership)]
    lines += ["## Restarts and failures", "", *(incidents(history) or ["None."])]
    checkpoints = history.of(Checkpoint)
    if checkpoints:
        lines += ["", f"{len(checkpoints)} checkpoint(s) written; the latest: epoch {checkpoints[-1].epoch}, "
                  f"`{checkpoints[-1].path}`."]
    lines.append("")
    if images:
        lines += ["## Plots", ""]
        for name, caption in images:
            lines += [f"![{caption}]({name})", ""]
    return "\n".join(lines)


def outcome(history: History) -> str:
    """How the job ended, in one line."""
    end = history.end
    if end is None:
        return "**no job_end yet**: the job is running or ended without a word."
    status = f"**{run_state(end, 0.0)}**"
    if end.epochs is not None:  # a job that failed or was interrupted says only why
        status += f": {end.epochs} epochs, {number(end.steps, ',')} steps in {number(end.seconds, '.1f')} s"
    message = end_message(end, history.of(WorkerFailed))
    return status + (f": {message}" if message else "") + "."


def job_rows(run_dir: Path, start: JobStart | None, loaded: DataLoaded | None,
             changed: bool = False) -> list[list[str]]:
    """The job and where it ran, as job_start (or the latest job_resumed, which repeats it) says, each detail
    it holds; `changed`: its machines changed, and these are the last attempt's."""
    rows = [["run directory", f"`{run_dir}`"]]
    if start is None:
        return [*rows, ["job", NOT_STARTED]]
    latest = " in the last attempt (see Machines over time)" if changed else ""
    world_size = None
    if start.world_size is not None:
        training = f" ({start.trainers} training)" if start.trainers is not None else ""
        world_size = f"{start.world_size}{training}{latest}"
    hosts = ", ".join(sorted(set(start.hosts)))
    details = [
        ["algorithm", start.algorithm],
        ["world size", world_size],
        ["hosts", hosts + latest if hosts else None],
        ["threads per worker", start.threads],
        ["device", start.device],
        *([name, format(value, ",")] for name, value in (
            ("train rows", start.train_rows), ("test rows", start.test_rows),
            ("steps per epoch", start.steps_per_epoch), ("parameters", start.parameters)) if value is not None),
        ["versions", ", ".join(f"{key} {value}" for key, value in start.versions.items()) or None],
    ]
    rows += [[name, str(value)] for name, value in details if value is not None]
    if loaded is not None:
        rows.append(["data loading", f"{loaded.seconds:.2f} s (slowest worker)"])
    return rows


def epoch_table(epochs: list[EpochEnd]) -> list[str]:
    """A row per epoch and the totals; a column of each epoch's training workers when their count changed."""
    if not epochs:
        return ["No epoch finished.", ""]
    metrics = metric_names(epochs)
    counted = len({len(record.workers) for record in epochs}) > 1  # the machines changed between epochs
    header = ["epoch", *(["workers"] if counted else []), "train loss", *(f"test {m}" for m in metrics),
              "samples/s", *(f"{part} s" for part in SPLIT_PARTS), "epoch s"]
    rows = [[str(record.epoch), *([str(len(record.workers))] if counted else []), f"{record.train_loss:.4f}",
             *(number(record.test.get(m), ".4f") for m in metrics), f"{record.samples_per_second:,.0f}",
             *(f"{seconds:.2f}" for seconds in record.seconds_split.parts().values()), f"{record.seconds:.2f}"]
            for record in epochs]
    samples = sum(record.samples for record in epochs)
    seconds = sum(record.seconds for record in epochs)
    totals = [sum(record.seconds_split.parts()[part] for record in epochs) for part in SPLIT_PARTS]
    rows.append(["**total**", *([""] if counted else []), "", *("" for _ in metrics),
                 f"{samples / seconds:,.0f}" if seconds else "-", *(f"{total:.2f}" for total in totals),
                 f"{seconds:.2f}"])
    return [*table(header, rows), "", f"{samples:,} samples trained in {seconds:.2f} s of epochs. The split is the "
            "mean over workers; evaluation runs on the coordinator while the others wait.", ""]


def shows_machines(epochs: list[EpochEnd]) -> bool:
    """Whether the records hold each worker's rate and share (a run written before shares could follow speed
    has neither), with more than one worker or shares that are not equal: as `shoal status` shows them."""
    recorded = [record for record in epochs if record.balance is not None
                and all(known_host(worker.host) for worker in record.workers)]  # unknown hosts are no machine
    return any(len(record.workers) > 1 or (record.workers and record.balance != "equal") for record in recorded)


def machine_epochs(epochs: list[EpochEnd]) -> dict[str, list[tuple[int, float | None, float | None]]]:
    """Host -> (epoch, its rows per second, its share of the rows) for every epoch whose record holds them."""
    found: dict[str, list[tuple[int, float | None, float | None]]] = {}
    for record in epochs:
        if record.balance is None:
            continue
        for machine in machine_paces(worker_paces(record)):
            found.setdefault(machine.host, []).append((record.epoch, machine.rate, machine.share))
    return found


def machine_table(epochs: list[EpochEnd]) -> list[str]:
    """Per machine: its ranks, its mean rate, its share of the rows in the first and the last epoch; then
    how the rows were shared and, with speed shares, after which epochs they moved."""
    recorded = [record for record in epochs if record.balance is not None]
    first, last = recorded[0].epoch, recorded[-1].epoch
    ranks: dict[str, list[int]] = {}
    for record in recorded:
        for worker in record.workers:
            ranks.setdefault(worker.host, [])
            if worker.rank not in ranks[worker.host]:
                ranks[worker.host].append(worker.rank)
    shares_at = [first] if first == last else [first, last]
    header = ["machine", "ranks", "mean rows/s", *(f"share, epoch {epoch}" for epoch in shares_at)]
    rows = []
    for host, points in machine_epochs(recorded).items():
        rates = [rate for _, rate, _ in points if rate is not None]
        shares = {epoch: share for epoch, _, share in points}
        rows.append([host, ", ".join(map(str, sorted(ranks[host]))),
                     f"{sum(rates) / len(rates):,.0f}" if rates else "-",
                     *(percent(shares.get(epoch)) for epoch in shares_at)])
    return [*table(header, rows), "", *balance_lines(recorded), ""]


def shares_table(epochs: list[EpochEnd]) -> list[str]:
    """A row per epoch whose shares differ by design (cluster.balance "speed" or fixed speeds): each worker's
    share of its rows, and the next epoch's rows where they moved."""
    rows = [[str(record.epoch), cell(shares_text(record)),
             cell(next_rows_text(record).removesuffix(" rows")) if record.next_shares else "not moved"]
            for record in epochs if shares_differ(record)]
    return [*table(["epoch", "shares of the rows", "next epoch's rows"], rows), ""]


def membership_table(membership: list[Membership]) -> list[str]:
    """A row per set of machines the job ran on: the attempt, the checkpoint's epoch it went on from, the
    machines and their workers, who left or joined, and why."""
    header = ["attempt", "from epoch", "machines", "workers", "world size", "left", "joined", "why"]
    rows = [[str(event.attempt), str(event.from_epoch) if event.from_epoch else "start",
             ", ".join(event.hosts) or "not recorded",
             ", ".join(map(str, event.workers)), str(event.world_size or sum(event.workers)),
             ", ".join(event.left) or "-", ", ".join(event.joined) or "-", cell(event.reason) or "-"]
            for event in membership]
    return [*table(header, rows), "", f"The machines changed {len(membership) - 1} time(s). Each set of machines "
            "goes on from the newest checkpoint (the epoch above), resharded onto its world size, with its first "
            "epoch's rows shared equally over its workers.", ""]


def cell(text: str) -> str:
    """Text for a table cell: a `|` would end the cell."""
    return text.replace("|", "\\|")


def percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def balance_lines(recorded: list[EpochEnd]) -> list[str]:
    """How the rows were shared (cluster.balance), the speed shares' moves, and what the rates are."""
    modes = list(dict.fromkeys(record.balance for record in recorded))
    shared = "; then ".join(mode if mode != "fixed" else balance_text(mode, []) for mode in modes)
    lines = [f"Rows shared (cluster.balance): {shared}."]
    if "speed" in modes:
        moves = [f"epoch {record.epoch} (to {next_rows(record)})" for record in recorded if record.next_shares]
        lines.append(f"Speed shares moved after {', '.join(moves) if moves else 'no epoch'}.")
    lines.append("A machine's rate is its workers' rows per second of their own work (compute and data, not "
                 "waits for the others), summed: what speed shares follow.")
    return lines


def next_rows(record: EpochEnd) -> str:
    """The next epoch's rows per machine (`host-a 1,500, host-b 900 rows`); per worker when the record's
    workers do not match its shares one for one."""
    if len(record.next_shares) != len(record.workers):
        return " / ".join(f"{rows:,}" for rows in record.next_shares) + " rows per worker"
    hosts: dict[str, int] = {}
    for worker, rows in zip(record.workers, record.next_shares):
        hosts[worker.host] = hosts.get(worker.host, 0) + rows
    return ", ".join(f"{host} {rows:,}" for host, rows in hosts.items()) + " rows"


def incidents(history: History) -> list[str]:
    """Failures, restarts and resumes in order, and the time lost to epochs trained twice."""
    found = []
    restarting = False  # the job_resumed that a restarted job writes repeats its job_restarted
    first_machines = next(iter(history.of(Membership)), None)  # the machines it started on: no incident
    for event in history.events:
        if isinstance(event, WorkerFailed):
            found.append(f"- worker failed: {event.text()}")
        elif isinstance(event, JobRestarted):
            redone = f", epochs redone: {event.epochs_redone}" if event.epochs_redone is not None else ""
            found.append(f"- restart {event.restart} from {source(event.from_epoch)}{redone}")
            restarting = True
        elif isinstance(event, Membership) and event is not first_machines:
            found.append(f"- machines changed: {machines_text(event)}")
            restarting = True
        elif isinstance(event, JobResumed):
            if not restarting:
                found.append(f"- resumed from {source(event.from_epoch)}")
            if event.resharded_from is not None:
                found[-1] += f"; the checkpoint of {event.resharded_from} workers resharded onto {event.world_size}"
            restarting = False
    attempts, kept = history.epochs, history.latest_epochs()
    if len(attempts) > len(kept):
        lost = sum(r.seconds for r in attempts) - sum(r.seconds for r in kept)
        found.append(f"- {len(attempts) - len(kept)} epoch(s) trained twice: {lost:.2f} s lost to restarts")
    return found


def source(from_epoch: int) -> str:
    return f"epoch {from_epoch}'s checkpoint" if from_epoch else "scratch"
