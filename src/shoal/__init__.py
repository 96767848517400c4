"""shoal: train one neural network across many commodity machines.

    import shoal
    result = shoal.fit("examples/a9a.toml", workers=2)
    result.metrics, result.model, result.run_dir
    model = shoal.load_model(result.run_dir)
"""

__version__ = "0.1.0"

from shoal.api import FitResult, fit  # noqa: E402
from shoal.config import JobConfig, load_job  # noqa: E402
from shoal.errors import ShoalError  # noqa: E402
from shoal.train.artifacts import load_model, predict  # noqa: E402

__all__ = ["FitResult", "JobConfig", "ShoalError", "fit", "load_job", "load_model", "predict", "__version__"]
