"""Whether tensors hold only finite numbers, in one wording for the trained model's file and a checkpoint's.

model.pt (`shoal.run.artifacts`) and a rank's checkpoint file (`shoal.train.state_checks`) refuse
weights that are not finite by the same rule, below both: parameters only, since a buffer may hold an
infinite mask by design.
"""

from __future__ import annotations

import torch


def nonfinite(name: str, tensor: torch.Tensor) -> str:
    """"" when a floating tensor holds only finite values (or it is not floating), else what it holds."""
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return ""
    bad = int((~torch.isfinite(tensor)).sum())
    return f"{name} holds {bad} non-finite value{'s' if bad != 1 else ''} (of {tensor.numel()})" if bad else ""


def nonfinite_parameters(names: list[str], stored: dict) -> str:
    """The first of the model's parameters (by state_dict name) whose stored weights are not all finite."""
    return next(filter(None, (nonfinite(f"weight {name!r}", stored[name]) for name in names if name in stored)), "")
