"""Each worker's validation on the rows it holds out (`train.validation_split`), after every epoch.

Kennedy et al.'s workers each keep part of their data back and report how their model does on it;
shoal's are chosen by `shoal.data.holdout` (the same rows for any number of workers), each trainer
validates its slice with its own replica, and the coordinator records every worker's metrics and
their mean weighted by rows.
"""

from __future__ import annotations

import torch

from shoal.data.holdout import validation_rows
from shoal.data.loader import Converter
from shoal.train.step import combined as combined_sums
from shoal.train.step import evaluate_rows


class HeldOut:
    """One trainer's held-out rows, read once, and its model's metrics on them."""

    def __init__(self, prepared, trainer: int, trainers: int, device: torch.device):
        self.prepared = prepared
        self.features, self.labels = validation_rows(prepared.source, prepared.held_out, trainer, trainers)
        self.convert = Converter.for_dataset(prepared.source, prepared.spec["input"], device,
                                             prepared.objective.label_dtype)

    def metrics(self, model: torch.nn.Module) -> dict[str, float]:
        """The model's metrics on these rows (and `rows`, their count; none without rows)."""
        if len(self.features) == 0:
            return {"rows": 0.0}
        prepared = self.prepared
        found = evaluate_rows(model, prepared.objective, prepared.evaluation_step, self.features, self.labels,
                              self.convert)
        return found | {"rows": float(len(self.features))}


def combined(per_worker: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the workers' held-out rows, weighted by their rows (AUC too: a mean of the
    workers' AUCs, not the AUC of their rows pooled); `rows`, the total."""
    sums = [{name: [value * found["rows"], found["rows"]] for name, value in found.items() if name != "rows"}
            for found in per_worker]  # as a step's logged numbers are summed: (value x rows, rows)
    return combined_sums(sums) | {"rows": sum(found.get("rows", 0.0) for found in per_worker)}
