"""shoal: train one neural network across many commodity machines.

    import shoal
    result = shoal.fit("examples/a9a.toml", workers=2)
    result.metrics, result.model, result.run_dir
    model = shoal.load_model(result.run_dir)  # trust_code=True for a model built by a model.factory

The names below load on first use, so light commands (`shoal status`) do not import torch.
"""

import importlib
import importlib.util

__version__ = "0.1.0"

_EXPORTS = {
    "FitResult": "shoal.api",
    "fit": "shoal.api",
    "resume": "shoal.api",
    "JobConfig": "shoal.config",
    "load_job": "shoal.jobs",
    "ShoalError": "shoal.errors",
    "WorkerError": "shoal.errors",
    "load_model": "shoal.run.artifacts",
    "predict": "shoal.inference.predictions",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if not name.startswith("_") and importlib.util.find_spec(f"shoal.{name}") is not None:
        return importlib.import_module(f"shoal.{name}")  # shoal.events.read_history(run), as the README writes it
    raise AttributeError(f"module 'shoal' has no attribute {name!r}")
