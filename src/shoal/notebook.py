"""Progress in a notebook cell while `shoal.fit` runs.

A notebook shows what the kernel's own Python prints, not what its worker processes write to the
file descriptors they inherit (that lands in the notebook server's log). So in a notebook the
caller's process relays the job's progress from its events file, the record every reader shares:
a line per finished epoch, from a thread that polls while the job runs (a record still being
written is left for the next poll: the reader skips a torn last line).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from shoal.events import EVENTS_FILE, read_history
from shoal.run.status import metrics_text


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's kernel module is loaded)."""
    return "ipykernel" in sys.modules


class EpochRelay:
    """Prints the run's epochs to `stream` as they finish; use as a context manager around the job."""

    def __init__(self, run_dir: str | Path, stream=None, interval: float = 1.0):
        self.run_dir, self.stream, self.interval = Path(run_dir), stream, interval
        self.shown = 0  # epochs already printed
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._poll, name="shoal-epoch-relay", daemon=True)

    def __enter__(self) -> EpochRelay:
        self.thread.start()
        return self

    def __exit__(self, *exception) -> None:
        self.stopped.set()
        self.thread.join()
        self.show()  # the last epoch, which may have ended after the last poll

    def _poll(self) -> None:
        while not self.stopped.wait(self.interval):
            self.show()

    def show(self) -> None:
        """Print a line for each epoch finished since the last call."""
        if not (self.run_dir / EVENTS_FILE).is_file():
            return
        history = read_history(self.run_dir, warn=False)  # polled each second: `shoal status` warns
        total = history.start.configured_epochs() if history.start is not None else None
        for epoch in history.epochs[self.shown:]:
            test = "  test " + metrics_text(epoch.test) if epoch.test else ""
            print(f"epoch {epoch.epoch}{f'/{total}' if total else ''}  train loss {epoch.train_loss:.4f}{test}  "
                  f"{epoch.samples_per_second:,.0f} samples/s", file=self.stream or sys.stdout, flush=True)
        self.shown = len(history.epochs)
