"""PowerSGD's arithmetic a step, without the network: this tree's compressor against another commit's.

PowerSGD's cost beside its two small all-reduces is its arithmetic on the gradients (error feedback, the
two products with the thin factors, the remainder, the approximation written back). This times
`PowerSGD.sum_` on the gradient bucket of each benchmark model (benchmarks/comm_models.py) with a
communicator that returns what it is given, in one process and one thread, the two versions alternated
step by step so that a slow spell of the machine weighs on both. `--against REV` loads the other
version's compression.py from git (`git show REV:src/shoal/algorithms/compression.py`).

    .venv/bin/python -m benchmarks.powersgd_arithmetic --against b90f4af
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.comm_models import MODELS, build
from benchmarks.common import ROOT, machine, machine_line, write_result
from shoal.algorithms import compression

SOURCE = "src/shoal/algorithms/compression.py"


class Loopback:
    """A communicator of two ranks whose sums are what this rank gave: the arithmetic alone is timed."""

    world_size = 2

    def all_reduce_sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def compressor_at(revision: str, folder: Path):
    """The PowerSGD class of compression.py as commit `revision` holds it."""
    text = subprocess.run(["git", "show", f"{revision}:{SOURCE}"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    path = folder / f"compression_{revision}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"compression_{revision}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.PowerSGD


def time_steps(classes: dict, shapes: list[torch.Size], steps: int, rank: int) -> dict[str, list[float]]:
    """Seconds of each version's sum_ per step, alternated (the order flips every step), the first 5 left out."""
    total = sum(shape.numel() for shape in shapes)
    gradient, flat = torch.randn(total, generator=torch.Generator().manual_seed(0)), torch.empty(total)
    compressors = {name: made(rank, 0) for name, made in classes.items()}
    seconds: dict[str, list[float]] = {name: [] for name in classes}
    for step in range(steps + 5):
        for name in list(classes)[:: 1 if step % 2 else -1]:
            flat.copy_(gradient)
            start = time.perf_counter()
            compressors[name].sum_(flat, shapes, "0", Loopback())
            if step >= 5:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="the commit whose compressor this tree's is timed against")
    parser.add_argument("--models", default="mlp,cnn-dense", help=f"some of {', '.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rank", type=int, default=4)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows, found = [], {}
    with tempfile.TemporaryDirectory() as folder:
        classes = {args.against: compressor_at(args.against, Path(folder)), "this tree": compression.PowerSGD}
        for model in args.models.split(","):
            shapes = [parameter.shape for parameter in build(model).parameters()]
            seconds = time_steps(classes, shapes, args.steps, args.rank)
            found[model] = seconds
            medians = {name: statistics.median(values) for name, values in seconds.items()}
            rows.append(f"| {model} | {1000 * medians[args.against]:.2f} | {1000 * medians['this tree']:.2f} | "
                        f"{medians['this tree'] / medians[args.against]:.2f}x |")
    markdown = "\n".join([
        "# PowerSGD's arithmetic a step, without the network", "",
        f"{machine_line()}. One process, one thread; `PowerSGD.sum_` (rank {args.rank}) on each model's gradient "
        f"bucket, a loopback communicator, {args.steps} steps per version alternated, medians. "
        f"`python -m benchmarks.powersgd_arithmetic {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
        f"| model | {args.against} (ms) | this tree (ms) | this tree over {args.against} |",
        "| --- | ---: | ---: | ---: |", *rows, ""])
    path = write_result("powersgd-arithmetic", markdown, {"machine": machine(), "arguments": vars(args),
                                                          "seconds": found})
    print(markdown)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
