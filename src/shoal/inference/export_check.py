"""An exported file is checked against the model it came from before it takes the user's name.

Tracing records the branch a forward took on its example and nothing else, so a model that
decides on the values of its input (`if x[:, 0].mean() > 0:`) would export without an error and
answer wrongly for the other branch. Three checks stand between that and the user: torch.export,
which fails loudly on such control flow; the tracer's own warnings, each a refusal where
torch.export could not vouch for the graph (an operator it lacks); and the
written file run on sample rows (the run's test and training sets where job.toml names them and
they still match, plus batches drawn to fall on both sides of a threshold on any feature), its
outputs compared with the model's within TOLERANCE. A drawn batch the model itself cannot answer
(values outside what it takes, such as an embedding's indices) proves nothing and is passed over.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import re
import tomllib
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from shoal.data.format import open_dataset
from shoal.errors import ShoalError

RELATIVE, ABSOLUTE = 1e-4, 1e-5
TOLERANCE = f"rtol {RELATIVE:g} of the row's largest output, atol {ABSOLUTE:g}"
"""How far a float32 output of the file may lie from the model's: |file - model| <= atol + rtol max|model row|.
Rounding follows the size of the sums behind a row, not of each output: a logit near zero beside large
ones may differ by far more than rtol of itself between two correct float32 computations."""
DATASET_ROWS = 256  # rows read from each of the run's datasets
DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "data-dependent", "DataDependent")


class ExportRefused(ShoalError):
    """The exported file would not answer as the model does; the message says why, without the path."""


def check_control_flow(wrapped: nn.Module, example: torch.Tensor) -> bool:
    """torch.export the model with a dynamic batch: an ExportRefused if its forward branches on the data;
    whether torch.export vouched for the graph. Its other failures (an operator it lacks) leave the
    model to the tracer's warnings and the sample rows."""
    quiet = logging.root.manager.disable
    logging.disable(logging.CRITICAL)  # torch logs the graph it gave up on: the refusal says enough
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):  # it prints the graph too
            warnings.simplefilter("ignore")
            torch.export.export(wrapped, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
        return True
    except Exception as error:  # torch.export raises many kinds; only the data-dependent ones decide here
        text = f"{type(error).__name__}: {error}"
        if any(mark in text for mark in DATA_DEPENDENT):
            raise ExportRefused(f"the model's forward branches on its input's values{_where(text)}, and an exported "
                                "file would keep one branch only") from None
        return False
    finally:
        logging.disable(quiet)


def _where(text: str) -> str:
    """' (file:line: code)' of the branch torch.export stopped at, where its message says."""
    found = re.search(r'raised this error:\s*File "([^"]+)", line (\d+), in (\w+)\n(?:\s*(?!The error above)(.+))?',
                      text)
    if not found:
        return ""
    if found.group(1).startswith("<"):  # a model shipped by value: no file to name
        return f" (in {found.group(3)})"
    code = f": {found.group(4).strip()}" if found.group(4) else f" in {found.group(3)}"
    return f" ({found.group(1)}:{found.group(2)}{code})"


def traced(trace: Callable[[], object], vouched: bool = False) -> object:
    """`trace()`'s result; a tracer warning (a value turned into a Python constant) is an ExportRefused
    unless torch.export `vouched` for the graph (torch's own LSTM warns on every trace)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = trace()
    for warning in [] if vouched else caught:
        if issubclass(warning.category, torch.jit.TracerWarning):
            first = str(warning.message).strip().splitlines()[0]
            raise ExportRefused(f"tracing the model warned: {first} ({warning.filename}:{warning.lineno})")
    return result


def sample_batches(run_dir: Path, artifact: dict) -> list[tuple[str, np.ndarray]]:
    """(name, rows in the stored dtype, shape (n, features)) to compare the file with the model on."""
    features = math.prod(artifact["spec"]["input"])
    dtype = np.dtype(artifact.get("feature_dtype", "float32"))
    return _dataset_rows(run_dir, features, dtype) + _drawn(features, dtype)


def _dataset_rows(run_dir: Path, features: int, dtype: np.dtype) -> list[tuple[str, np.ndarray]]:
    """The first rows of the run's test and training sets, where job.toml names them and they match."""
    try:
        data = tomllib.loads((run_dir / "job.toml").read_text(encoding="utf-8")).get("data", {})
    except (OSError, ValueError):
        return []
    found = []
    for key in ("test", "train"):
        try:
            dataset = open_dataset(str(data[key]))
            if dataset.features != features or dataset.feature_dtype != dtype or not dataset.rows:
                continue
            rows, _ = dataset.read_rows(0, min(dataset.rows, DATASET_ROWS))
        except Exception:  # a dataset moved, removed or changed since: the drawn rows remain
            continue
        found.append((f"data.{key}", rows.reshape(len(rows), features)))
    return found


def _drawn(features: int, dtype: np.dtype) -> list[tuple[str, np.ndarray]]:
    """Batches on both sides of any threshold a forward may test (a mean, a sign, a pixel level), and one
    row alone (the batch dimension is dynamic)."""
    generator = np.random.default_rng(0)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        low, high = max(info.min, -128), min(info.max, 255)
        batches = {"random": generator.integers(low, high + 1, size=(64, features)),
                   "low": generator.integers(low, low + (high - low) // 4 + 1, size=(16, features)),
                   "high": generator.integers(high - (high - low) // 4, high + 1, size=(16, features))}
    else:
        normal = generator.standard_normal((64, features))
        batches = {"random": normal, "positive": np.abs(normal[:16]) + 1, "negative": -np.abs(normal[16:32]) - 1,
                   "large": normal[32:48] * 100, "zeros": np.zeros((4, features))}
    drawn = [(f"drawn {name}", values.astype(dtype)) for name, values in batches.items()]
    return drawn + [("drawn one row", drawn[0][1][:1])]


def compare(wrapped: nn.Module, run: Callable[[np.ndarray], np.ndarray], batches: list[tuple[str, np.ndarray]]
            ) -> None:
    """An ExportRefused naming the largest difference when the file's outputs are not the model's."""
    worst = (0.0, "", 0)
    for name, rows in batches:
        expected = _expected(wrapped, name, rows)
        if expected is None:
            continue
        actual = np.asarray(run(rows), dtype=np.float64).reshape(len(rows), -1)
        if actual.shape != expected.shape:
            raise ExportRefused(f"on {name} rows the file gives outputs of shape {list(actual.shape)}, "
                                f"the model {list(expected.shape)}")
        beyond = _beyond_tolerance(actual, expected)
        if beyond.max() > worst[0]:
            worst = (float(beyond.max()), name, int(np.unravel_index(beyond.argmax(), beyond.shape)[0]))
    if worst[1]:
        raise ExportRefused(f"the exported file answers differently from the model: largest difference "
                            f"{worst[0]:.3g} on {worst[1]} rows (row {worst[2] + 1}); tolerance {TOLERANCE}")


def _expected(wrapped: nn.Module, name: str, rows: np.ndarray) -> np.ndarray | None:
    """The model's outputs on `rows`, one row of them per input row; None for drawn rows it refuses."""
    try:
        with torch.no_grad():
            outputs = wrapped(torch.from_numpy(np.ascontiguousarray(rows)))
    except Exception:  # drawn values the model does not take (an index out of range); the data's rows must pass
        if name.startswith("drawn"):
            return None
        raise
    return outputs.numpy().astype(np.float64).reshape(len(rows), -1)


def _beyond_tolerance(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """|actual - expected| where it passes the tolerance, else 0 (equal values, infinities and NaN alike, pass)."""
    difference = np.abs(actual - expected)
    difference[(actual == expected) | (np.isnan(actual) & np.isnan(expected))] = 0.0
    difference = np.where(np.isnan(difference), np.inf, difference)
    finite = np.where(np.isfinite(expected), np.abs(expected), 0.0)
    bound = ABSOLUTE + RELATIVE * finite.max(axis=1, keepdims=True)
    return np.where(difference > bound, difference, 0.0)
