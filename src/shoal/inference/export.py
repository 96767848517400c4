"""A trained model out of shoal: TorchScript, ONNX or safetensors files that load without shoal.

`shoal export RUN --format torchscript|onnx|safetensors`. TorchScript and ONNX files hold the whole
computation and take the rows as a dataset stores them, shape (batch, features) or (batch, *shape):
the same scaling (uint8 images divided by 255) and reshaping as shoal's own loader come first, and
the model's raw outputs come out (class logits, one logit for binary_cross_entropy, the value for a
regression), with a dynamic batch dimension. A safetensors file holds the weights only, with the
model's spec, loss and classes as JSON in its metadata. Files are written under an unpredictable
temporary name created exclusively beside OUT (a link planted there is never followed), checked
(`shoal.inference.export_check`: a TorchScript or ONNX file must give the model's outputs on sample
rows, a safetensors file its very weights) and renamed, with the mode any new file gets (0666 less
the umask), so a failure or refusal leaves nothing behind; a model built by code is loaded only
when trusted.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from shoal.data.loader import feature_scale
from shoal.durable import replace_durably
from shoal.errors import ConfigError, ShoalError, first_line
from shoal.inference.export_check import ExportRefused, check_control_flow, compare, sample_batches, traced
from shoal.model import Trust
from shoal.run.artifacts import MODEL_FILE, TRAINING_SET, check_out, load_artifact, rebuild
from shoal.safe_files import new_temporary

FORMATS = {"torchscript": ".pt", "onnx": ".onnx", "safetensors": ".safetensors"}
EXTRAS = {"onnx": ("onnx", "shoal[onnx]"), "safetensors": ("safetensors", "shoal[safetensors]")}


class StoredRows(nn.Module):
    """The model behind shoal's own conversion of stored rows: to float, scaled, reshaped per sample."""

    def __init__(self, model: nn.Module, scale: float, input_shape: list[int]):
        super().__init__()
        self.model, self.scale, self.input_shape = model, scale, tuple(input_shape)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.model(rows.float().mul(self.scale).reshape((-1,) + self.input_shape))


def export(run_dir: str | Path, format: str, out: str | Path | None = None, *, overwrite: bool = False,
           trust_code: Trust = False) -> Path:
    """Write the run's model as `format`; the file's path (default: the run's name and the format's
    extension, in the current folder)."""
    if format not in FORMATS:
        raise ConfigError(f"--format: must be one of {', '.join(FORMATS)}, got {format!r}")
    _check_extra(format)
    out = check_out(run_dir, out or Path(Path(run_dir).resolve().name + FORMATS[format]), overwrite,
                    f"the {format} model")
    artifact = load_artifact(run_dir)
    fields = (artifact.get(TRAINING_SET) or {}).get("fields") if isinstance(artifact.get(TRAINING_SET), dict) else None
    if fields and format != "safetensors":  # the weights alone carry no claim about the rows they take
        names = ", ".join(field["name"] for field in fields)
        raise ShoalError(f"{Path(run_dir) / MODEL_FILE}: trained on rows of named fields ({names}), which the "
                         f"training step fed to the model: a {format} file taking stored rows would compute "
                         "something else; export --format safetensors (the weights), or load it with "
                         "shoal.load_model")
    model = rebuild(artifact, Path(run_dir) / MODEL_FILE, trust_code)
    descriptor, temporary = new_temporary(out)
    os.close(descriptor)
    try:
        WRITERS[format](model, artifact, temporary)
        CHECKS[format](model, artifact, temporary, Path(run_dir))
        os.chmod(temporary, new_file_mode())
        replace_durably(temporary, out)
    except ExportRefused as error:
        raise ShoalError(f"{out}: not exported as {format}: {error}") from None
    except ShoalError:
        raise
    except Exception as error:  # what the exporter refuses: an operator, control flow
        raise ShoalError(f"{out}: cannot export the model as {format}: {type(error).__name__}: "
                         f"{first_line(error)}") from None
    finally:
        temporary.unlink(missing_ok=True)
    return out


def new_file_mode() -> int:
    """The mode open() gives a new file: 0666 less the umask (a temporary is made 0600)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _check_extra(format: str) -> None:
    if format not in EXTRAS:
        return
    module, extra = EXTRAS[format]
    try:
        __import__(module)
    except ImportError:
        raise ConfigError(f"--format {format}: needs the {module} package: pip install '{extra}'") from None


def stored_rows_model(model: nn.Module, artifact: dict) -> tuple[StoredRows, torch.Tensor]:
    """The model taking stored rows, and two example rows (zeros in the stored dtype)."""
    input_shape = artifact["spec"]["input"]
    dtype = np.dtype(artifact.get("feature_dtype", "float32"))
    wrapped = StoredRows(model.eval(), feature_scale(dtype), input_shape).eval()
    example = torch.from_numpy(np.zeros((2, math.prod(input_shape)), dtype=dtype))
    return wrapped, example


@torch.no_grad()
def write_torchscript(model: nn.Module, artifact: dict, path: Path) -> None:
    wrapped, example = stored_rows_model(model, artifact)
    vouched = check_control_flow(wrapped, example)
    traced(lambda: torch.jit.trace(wrapped, example, check_trace=False), vouched).save(str(path))


@torch.no_grad()
def write_onnx(model: nn.Module, artifact: dict, path: Path) -> None:
    """Through torch's TorchScript-based exporter: it needs no onnxscript and gives the same graph each time;
    torch.export first refuses control flow on the data, and each tracer warning is a refusal."""
    wrapped, example = stored_rows_model(model, artifact)
    vouched = check_control_flow(wrapped, example)
    with contextlib.redirect_stdout(None):
        traced(lambda: torch.onnx.export(
            wrapped, (example,), str(path), dynamo=False, input_names=["rows"], output_names=["outputs"],
            dynamic_axes={"rows": {0: "batch"}, "outputs": {0: "batch"}}), vouched)


def write_safetensors(model: nn.Module, artifact: dict, path: Path) -> None:
    from safetensors.torch import save_file

    metadata = {"format": "pt", "shoal.spec": json.dumps(artifact["spec"]), "shoal.loss": artifact["loss"],
                "shoal.classes": json.dumps(artifact.get("classes")),
                "shoal.feature_dtype": str(artifact.get("feature_dtype", "float32"))}
    if artifact.get(TRAINING_SET) is not None:
        metadata["shoal.training_set"] = json.dumps(artifact[TRAINING_SET], default=str)
    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, str(path), metadata)


WRITERS = {"torchscript": write_torchscript, "onnx": write_onnx, "safetensors": write_safetensors}


def check_torchscript(model: nn.Module, artifact: dict, path: Path, run_dir: Path) -> None:
    loaded = torch.jit.load(str(path))
    wrapped, _ = stored_rows_model(model, artifact)

    def run(rows: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return loaded(torch.from_numpy(np.ascontiguousarray(rows))).numpy()

    compare(wrapped, run, sample_batches(run_dir, artifact))


def check_onnx(model: nn.Module, artifact: dict, path: Path, run_dir: Path) -> None:
    """Run the file in onnxruntime (onnx's reference evaluator without it)."""
    try:
        import onnxruntime

        runner = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except ImportError:
        from onnx.reference import ReferenceEvaluator

        runner = ReferenceEvaluator(str(path))

    def run(rows: np.ndarray) -> np.ndarray:
        return runner.run(None, {"rows": np.ascontiguousarray(rows)})[0]

    wrapped, _ = stored_rows_model(model, artifact)
    compare(wrapped, run, sample_batches(run_dir, artifact))


def check_safetensors(model: nn.Module, artifact: dict, path: Path, run_dir: Path) -> None:
    """The file's tensors must be the model's weights, bit for bit."""
    from safetensors.torch import load_file

    stored, weights = load_file(str(path)), model.state_dict()
    for name, tensor in weights.items():
        if name not in stored or not torch.equal(stored[name], tensor):
            raise ExportRefused(f"the written weights differ from the model's at {name!r}")


CHECKS = {"torchscript": check_torchscript, "onnx": check_onnx, "safetensors": check_safetensors}
