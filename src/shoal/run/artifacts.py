"""The trained model in a run directory: saving, loading and predicting with it.

`model.pt` holds the weights together with the model spec, the loss, the classes and what the
training set's rows look like (`shoal.data.compatible.schema`), so a run directory alone is
enough to rebuild the module, check a dataset against it and turn its outputs into labels. It is
written durably under a temporary name, and read with `weights_only=True`. It is never written from
weights that are not finite without saying so: the job stops in one line naming the first such
parameter, unless `checkpoint.allow_nonfinite` asks to keep them (then it is written with a warning).

A run directory is data: anyone may have written it. A model built by code (`model.factory`)
is rebuilt only when the user trusts that code (`trust_code`), and predictions never replace a
file unasked, nor one inside the run directory.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch

from shoal.data.compatible import check_compatible, schema
from shoal.data.format import Dataset
from shoal.durable import disk_full, write_durably
from shoal.errors import ConfigError, DataError, ShoalError, first_line
from shoal.finite import nonfinite_parameters
from shoal.model import Trust, build_model, check_trusted

MODEL_FILE = "model.pt"
TRAINING_SET = "training_set"  # model.pt's key for the training set's schema


def save_model(run_dir: str | Path, model: torch.nn.Module, spec: dict, loss: str,
               classes: list | None, feature_dtype: str, *, training_set: Dataset | None = None,
               allow_nonfinite: bool = False) -> Path:
    """Write model.pt (`loss`: the name of the loss it was trained with, which predictions read its outputs by);
    with `training_set`, also what a dataset must match to be predicted. Parameters that are
    not finite are a ShoalError, nothing written, unless `allow_nonfinite` (then a warning)."""
    path = Path(run_dir) / MODEL_FILE
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    check_finite(run_dir, [name for name, _ in model.named_parameters(remove_duplicate=False)], state,
                 allow_nonfinite)
    content = {"spec": spec, "state_dict": state, "loss": loss, "classes": classes,
               "feature_dtype": feature_dtype}
    if training_set is not None:
        content[TRAINING_SET] = schema(training_set)
    try:  # under a new, unpredictable temporary name; a link at model.pt is refused
        write_durably(path, lambda handle: torch.save(content, handle))
    except (OSError, RuntimeError) as error:
        if disk_full(error):
            raise ShoalError(f"{run_dir}: the disk is full: {MODEL_FILE} not written (free some space, then "
                             f"--resume {run_dir})") from None
        raise
    return path


def check_finite(run_dir: str | Path, names: list[str], state: dict, allow_nonfinite: bool) -> None:
    """Refuse to write weights of which a parameter is not finite (buffers may hold an infinite mask by design);
    with `allow_nonfinite`, warn."""
    problem = nonfinite_parameters(names, state)
    if problem and not allow_nonfinite:
        raise ShoalError(f"{run_dir}: {MODEL_FILE} not written: the trained {problem}; set "
                         "checkpoint.allow_nonfinite = true to write it all the same")
    if problem:
        warnings.warn(f"{run_dir}: {MODEL_FILE} written with weights that are not finite: the trained {problem} "
                      "(checkpoint.allow_nonfinite)", stacklevel=3)


def load_artifact(run_dir: str | Path) -> dict:
    """model.pt's content, as data: nothing in it is imported or run."""
    path = Path(run_dir) / MODEL_FILE
    if not path.exists():
        raise ShoalError(f"{path}: no trained model (did the job finish?)")
    try:
        artifact = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several kinds for a damaged file
        raise ShoalError(f"{path}: cannot load model: {first_line(error)}") from None
    if not (isinstance(artifact, dict) and isinstance(artifact.get("spec"), dict)
            and isinstance(artifact.get("state_dict"), dict)):
        raise ShoalError(f"{path}: not a shoal model file (no model spec and weights)")
    return artifact


def rebuild(artifact: dict, path: Path, trust: Trust = False) -> torch.nn.Module:
    """The module of a loaded model.pt, in eval mode; its factory is imported only if trusted."""
    spec = artifact["spec"]
    check_trusted(spec, str(path), trust)
    try:
        model = build_model(spec, path.parent)
        model.load_state_dict(artifact["state_dict"])
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    except (KeyError, TypeError, RuntimeError) as error:  # a spec or weights that do not fit together
        raise ShoalError(f"{path}: cannot rebuild the model: {first_line(error)}") from None
    return model.cpu().eval()  # a module shipped from a GPU unpickles there: predict and export run on the CPU


def load_model(run_dir: str | Path, *, trust_code: Trust = False) -> torch.nn.Module:
    """The trained module of a run, in eval mode, on the CPU.

    A model built by a factory imports and runs code named in the run directory: it is refused
    unless `trust_code` is True (or the name of that very factory).
    """
    return rebuild(load_artifact(run_dir), Path(run_dir) / MODEL_FILE, trust_code)


def check_dataset(artifact: dict, dataset: Dataset, path: Path) -> None:
    """The dataset must hold rows like the training set's, as far as model.pt says (older files say less)."""
    reference = {"feature_dtype": artifact["feature_dtype"]} if isinstance(artifact.get("feature_dtype"), str) else {}
    stored = artifact.get(TRAINING_SET)
    if stored is not None:
        if not (isinstance(stored, dict) and isinstance(stored.get("feature_dtype"), str)
                and isinstance(stored.get("shape"), list)):
            raise ShoalError(f"{path}: '{TRAINING_SET}' is damaged (expected feature_dtype and shape)")
        reference |= stored
    check_compatible(dataset, reference, f"the model's training set ({path})")
    input_shape = artifact["spec"].get("input")
    if not isinstance(input_shape, list) or not all(isinstance(size, int) for size in input_shape):
        raise ShoalError(f"{path}: the model spec has no input shape")
    if dataset.features != math.prod(input_shape):
        raise DataError(f"{dataset.path}: {dataset.features} features, but the model takes {input_shape}")


def check_out(run_dir: str | Path, out: str | Path, overwrite: bool, what: str = "predictions") -> Path:
    """Where predictions (or `what` else) may go: not inside the run directory, and over an existing file
    only when asked."""
    out = Path(out)
    run = Path(run_dir).resolve()
    if out.resolve() == run or out.resolve().is_relative_to(run):
        raise ShoalError(f"{out}: inside the run directory {run_dir}; write {what} elsewhere "
                         "(a run's files are never replaced, --overwrite or not)")
    if not out.parent.is_dir():
        raise ShoalError(f"--out: folder {out.parent} does not exist")
    if out.is_dir():
        raise ShoalError(f"{out}: a folder; --out names the {what} file")
    if not overwrite and (out.exists() or out.is_symlink()):
        raise ShoalError(f"{out}: already exists; pass --overwrite (overwrite=True) to replace it")
    return out
