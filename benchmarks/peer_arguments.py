"""What every peer script of benchmarks/peers.py shares: its common options and the arrays it reads.

Kept apart from benchmarks/common.py, which imports torch: the Spark and scikit-learn peers would
otherwise pay torch's import in the set-up time they report.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def peer_parser(description: str, epochs_help: str | None = None) -> argparse.ArgumentParser:
    """--data, --out, --epochs, --hidden and --seed; each peer adds its own options."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a folder of arrays written by benchmarks/peers.py")
    parser.add_argument("--out", required=True, help="the JSON result to write")
    parser.add_argument("--epochs", type=int, default=5, help=epochs_help)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def load_arrays(data: str | Path, split: str, mmap: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Features and class indices of `split` (train or test) as benchmarks/peers.py saved them."""
    mode = "r" if mmap else None
    return (np.load(Path(data) / f"{split}_features.npy", mmap_mode=mode),
            np.load(Path(data) / f"{split}_labels.npy", mmap_mode=mode))
