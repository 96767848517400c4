"""A CSV import's memory is set by its chunk sizes, not by the size of the input.

The import runs in a child process with small chunk sizes (256 KB CSV blocks, 2,048-row row
groups, 1 MB feature chunks). The child first imports a tiny file, so that the libraries' code
and thread pools are in memory, then reads its own peak resident memory (ru_maxrss) before and
after importing a 200,000-row, 30-column CSV of about 60 MB, with a categorical column, so
both passes (categories, then features) are covered. Loading that file whole would take at
least its text; the peak may grow by at most three quarters of it. (With the default chunk
sizes, `shoal data import` of a 3-million-row, 30-column CSV peaks near 340 MB resident, as
one of 1 million rows does: flat too, at a higher level.)
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

ROWS = 200_000

CHILD = """
import resource, sys
from shoal.data import importers
from shoal.data.importers import common, csv_format
csv_format.CSV_BLOCK_BYTES = 256 * 1024
common.ROW_GROUP_ROWS = 2048
common.CHUNK_BYTES = 1024 * 1024
importers.import_dataset("tiny.csv", "warm", "csv", categorical=["color"])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
dataset = importers.import_dataset("big.csv", "out", "csv", categorical=["color"])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(dataset.rows, dataset.shape[0], (after - before) * 1024)  # ru_maxrss is in KiB on Linux
"""


def write_csv(path, rows: int, seed: int) -> None:
    """`rows` rows: a block of up to 10,000 random rows written over and over (formatting numbers is slow)."""
    block_rows = min(rows, 10_000)
    generator = np.random.default_rng(seed)
    columns = {f"f{index}": generator.standard_normal(block_rows).astype(np.float32) for index in range(28)}
    columns["color"] = np.array(["red", "green", "blue"])[generator.integers(0, 3, block_rows)]
    columns["label"] = generator.integers(0, 2, block_rows)
    buffer = pa.BufferOutputStream()
    pa_csv.write_csv(pa.table(columns), buffer, pa_csv.WriteOptions(include_header=False))
    with open(path, "wb") as handle:
        handle.write(",".join(columns).encode() + b"\n")
        for _ in range(rows // block_rows):
            handle.write(buffer.getvalue().to_pybytes())


def test_csv_import_peak_memory_does_not_follow_the_file_size(tmp_path, project_env):
    write_csv(tmp_path / "tiny.csv", 100, seed=0)
    write_csv(tmp_path / "big.csv", ROWS, seed=1)
    text_bytes = (tmp_path / "big.csv").stat().st_size
    assert text_bytes > 50 * 2**20
    result = subprocess.run([sys.executable, "-c", CHILD], cwd=tmp_path, env=project_env, capture_output=True,
                            text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    rows, features, growth = map(int, result.stdout.split())
    assert (rows, features) == (ROWS, 28 + 3)
    bound = text_bytes * 3 // 4
    assert growth < bound, f"peak memory grew by {growth / 2**20:.0f} MB for a {text_bytes / 2**20:.0f} MB file"
