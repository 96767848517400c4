"""The grid of a scaling study: its dataset sizes (made once from the job's training set) and worker counts.

Sizes come either as row counts (a stratified random subset of that many rows; the whole set
when the count equals it) or as minority:majority ratios (every minority row plus ratio x as
many majority rows, the Parallel SGD study's under-sampling of Medicare claims). Each derived
dataset is written once under the study's `data/` folder with the study's seed, so every trial
and worker count of one size trains on the very same rows, and a rerun reuses them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from shoal.data.derive import parse_ratio, sample, subset
from shoal.data.format import Dataset, open_dataset
from shoal.errors import ConfigError

SUFFIXES = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


@dataclass(frozen=True)
class Size:
    """One dataset size of the grid."""

    label: str
    """As the user wrote it, normalized: '22400' rows or '1:25'."""
    rows: int
    path: str
    """The dataset folder the trials of this size train on."""


def parse_workers(text: str, option: str = "--workers") -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, without repeats); errors name the option."""
    counts = set()
    for item in text.split(","):
        try:
            count = int(item.strip())
        except ValueError:
            count = 0
        if count < 1:
            raise ConfigError(f"{option} {text!r}: expected counts >= 1 separated by commas, like 1,2,4")
        counts.add(count)
    return sorted(counts)


def parse_rows(text: str) -> list[int]:
    """'2240,22400,2.2M' -> [2240, 22400, 2200000] (sorted, without repeats); errors name --sizes."""
    sizes = set()
    for item in text.split(","):
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgG]?)\s*", item)
        rows = Fraction(match.group(1)) * SUFFIXES[match.group(2).lower()] if match else Fraction(0)
        if rows.denominator != 1 or rows < 1:
            raise ConfigError(f"--sizes {text!r}: expected row counts separated by commas, like 2240,22400,2.2M")
        sizes.add(int(rows))
    return sorted(sizes)


def parse_ratios(text: str) -> list[tuple[str, Fraction]]:
    """'1:1,1:25' -> [('1:1', 1), ('1:25', 25)] in the order given; errors name --ratios."""
    ratios = []
    for item in text.split(","):
        ratio = parse_ratio(item, f"--ratios {text!r}:")
        label = f"1:{ratio.numerator}" if ratio.denominator == 1 else f"1:{float(ratio):g}"
        if label not in (known for known, _ in ratios):
            ratios.append((label, ratio))
    return ratios


def derive_sizes(train: Dataset, data_dir: Path, *, rows: list[int] | None = None,
                 ratios: list[tuple[str, Fraction]] | None = None, seed: int = 0) -> list[Size]:
    """The grid's datasets, derived from `train` into `data_dir` (or found there from an earlier run)."""
    sizes = []
    for count in rows or []:
        if count > train.rows:
            raise ConfigError(f"--sizes: {count:,} rows asked for, but data.train ({train.path}) holds {train.rows:,}")
        if count == train.rows:
            sizes.append(Size(str(count), count, train.path))
            continue
        folder = data_dir / f"rows-{count}"
        dataset = _existing(folder, train, seed) or subset(train, folder, rows=count, seed=seed)
        sizes.append(Size(str(count), dataset.rows, dataset.path))
    for label, ratio in ratios or []:
        folder = data_dir / f"ratio-{label.replace(':', '-')}"
        dataset = _existing(folder, train, seed) or sample(train, folder, ratio=ratio, seed=seed)
        sizes.append(Size(label, dataset.rows, dataset.path))
    return sorted(sizes, key=lambda size: (size.rows, size.label))


def _existing(folder: Path, train: Dataset, seed: int) -> Dataset | None:
    """A dataset an earlier run of the study derived, if it came from this training set with this seed.

    Derived folders appear whole or not at all, so one that exists is complete.
    """
    if not folder.exists():
        return None
    dataset = open_dataset(str(folder))
    how = (dataset.meta.get("derived") or [{}])[-1]
    origin = train.path if "://" in train.path else os.path.abspath(train.path)
    if how.get("seed") != seed or how.get("from") != origin:
        raise ConfigError(f"{folder}: derived from {how.get('from')} with seed {how.get('seed')}, not from "
                          f"{train.path} with seed {seed}: choose another --out")
    return dataset
