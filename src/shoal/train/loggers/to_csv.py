"""RUN_DIR/metrics.csv: one row per epoch_end record, for a spreadsheet or pandas.

The columns are fixed by the first epoch's record (the epoch, its totals, every test metric the
objective can give and the job's own, `train.metrics`, the numbers the user's step logs, the held-out
rows' metrics, the time split, each param group's learning rate), so a row never needs a column the header
lacks; columns are named as epoch_end's fields, nested ones dotted (`test.accuracy`, `train_metrics.penalty`,
`validation.loss`, `seconds_split.compute`), the learning rates as the other loggers name them, dotted (`lr` for
an optimizer of one group, `lr.group0`, `lr.group1`... for several), then `world_size`: the workers of the attempt
that trained the epoch (it changes between epochs in a job whose machines change). A file begun before a column
existed goes on without it. Each row is flushed to disk as it is written, so a crashed job keeps its epochs. A
resumed job appends under the header already there (a row cut short by a crash is dropped first); an
epoch redone after a restart gets a second row, as it has a second record. The file is never opened
through a symbolic link (`shoal.safe_files`).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path

from shoal.events import SPLIT_PARTS, EpochEnd, Event
from shoal.safe_files import open_file
from shoal.train.loggers.scalars import WorldSize, learning_rates

CSV_FILE = "metrics.csv"
TOTALS = ("epoch", "step", "time", "train_loss", "samples", "seconds", "samples_per_second")
WORLD_SIZE = "world_size"


def columns(test_metrics: Sequence[str]) -> list[str]:
    return [*TOTALS, *(f"test.{name}" for name in test_metrics), *(f"seconds_split.{part}" for part in SPLIT_PARTS),
            WORLD_SIZE]


def own_columns(event: EpochEnd) -> list[str]:
    """The columns of the param groups' learning rates, the numbers the user's step logs and the held-out rows'
    metrics, as the first epoch names them (the groups, the step's names and the loss's metrics stay the same)."""
    return [*learning_rates(event, "."),
            *(f"train_metrics.{name}" for name in event.train_metrics or {}),
            *(f"validation.{name}" for name in event.validation or {})]


def row(event: EpochEnd, world_size: int | None = None) -> dict:
    values = {name: getattr(event, name) for name in TOTALS}
    values.update({f"test.{name}": value for name, value in event.test.items()})
    values.update({f"train_metrics.{name}": value for name, value in (event.train_metrics or {}).items()})
    values.update({f"validation.{name}": value for name, value in (event.validation or {}).items()})
    values.update({f"seconds_split.{part}": seconds for part, seconds in event.seconds_split.parts().items()})
    values.update(learning_rates(event, "."))
    values[WORLD_SIZE] = world_size  # an unknown one is an empty cell
    return values


class CsvLogger:
    def __init__(self, run_dir: Path, test_metrics: Sequence[str]):
        self.path = Path(run_dir) / CSV_FILE
        header = existing_header(self.path)
        descriptor = open_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self.handle = os.fdopen(descriptor, "a", newline="", encoding="utf-8")
        self.test_metrics = test_metrics
        # a new file's header waits for the first epoch, which names the step's logged numbers
        self.writer = csv.DictWriter(self.handle, header, extrasaction="ignore") if header else None
        self.world_size = WorldSize()

    def write(self, event: Event) -> None:
        self.world_size.follow(event)
        if isinstance(event, EpochEnd):
            if self.writer is None:
                header = columns(self.test_metrics)
                self.writer = csv.DictWriter(self.handle, [*header[:-1], *own_columns(event), header[-1]],
                                             extrasaction="ignore")
                self.writer.writeheader()
            self.writer.writerow(row(event, self.world_size.value))
            self.flush()

    def flush(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()


def existing_header(path: Path) -> list[str] | None:
    """The columns of a file an earlier attempt wrote, its torn last row cut off; None for no file."""
    if not path.is_symlink() and (not path.is_file() or path.stat().st_size == 0):
        return None
    with os.fdopen(open_file(path, os.O_RDWR), "rb+") as handle:
        content = handle.read()
        if not content.endswith(b"\n"):
            handle.truncate(content.rfind(b"\n") + 1)
    lines = content.decode("utf-8").splitlines()
    return next(csv.reader(lines[:1]), None) if content.count(b"\n") else None
