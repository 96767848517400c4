"""What the coordinator shows while a job runs: a bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys

from tqdm import tqdm

from shoal.events import EpochEnd


def _format_metrics(values: dict) -> str:
    return "  ".join(f"{key} {value:.4f}" for key, value in values.items())


class ProgressDisplay:
    """Per-step bar (terminal) or one line per epoch (logs), on rank 0 only."""

    def __init__(self, mode: str, epochs: int, steps: int, enabled: bool, stream=None):
        self.stream = stream or sys.stdout
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "lines"
        self.mode = mode if enabled else "none"
        self.epochs, self.steps = epochs, steps
        self.bar: tqdm | None = None

    def start_epoch(self, epoch: int, steps: int | None = None) -> None:
        """`steps`: this epoch's steps on rank 0, when shares sized by speed make them differ from the job's."""
        self.steps = steps or self.steps
        if self.mode == "bar":
            self.bar = tqdm(total=self.steps, desc=f"epoch {epoch + 1}/{self.epochs}", unit="step",
                            file=self.stream, leave=True, dynamic_ncols=True)

    def step(self, loss: float) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if self.bar.n % 20 == 0 or self.bar.n == self.steps:
                self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def end_epoch(self, epoch: int, record: EpochEnd) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.mode == "none":
            return
        split = "  ".join(f"{part} {seconds:.2f}s" for part, seconds in record.seconds_split.parts().items())
        logged = _format_metrics({f"train_{name}": value for name, value in (record.train_metrics or {}).items()})
        held_out = {f"held_out_{name}": value for name, value in (record.validation or {}).items() if name != "rows"}
        parts = [f"epoch {epoch + 1}/{self.epochs}", f"train_loss {record.train_loss:.4f}", logged,
                 _format_metrics(held_out), _format_metrics(record.test),
                 f"{record.samples_per_second:,.0f} samples/s", f"[{split}]"]
        print("  ".join(part for part in parts if part), file=self.stream, flush=True)

    def message(self, text: str) -> None:
        if self.mode != "none":
            print(text, file=self.stream, flush=True)
