"""Import speed and memory: a 10,000,000-row CSV of 30 numeric columns and a label.

The CSV is generated once (about 3 GB) into benchmarks/work; `shoal data import` then runs in a
fresh process whose peak resident memory is read from the kernel's accounting of finished
children. Targets: memory stays flat as the input grows (under 1 GB at 10 million rows);
rows per second reported. Run with --rows for a smaller file.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

from benchmarks.common import WORK, machine, machine_line, write_result

COLUMNS = 30


def write_csv(path, rows: int, chunk: int = 200_000) -> None:
    generator = np.random.default_rng(0)
    header = ",".join([f"x{i}" for i in range(COLUMNS)] + ["label"])
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w") as handle:
        handle.write(header + "\n")
        for start in range(0, rows, chunk):
            count = min(chunk, rows - start)
            block = np.round(generator.normal(size=(count, COLUMNS)), 4)
            labels = (block[:, 0] + block[:, 1] > 0).astype(int)
            np.savetxt(handle, np.column_stack([block, labels]), delimiter=",",
                       fmt=["%.4f"] * COLUMNS + ["%d"])
    temporary.rename(path)


def import_once(source, out) -> tuple[float, int]:
    """Seconds and peak resident bytes of one `shoal data import` in a fresh process."""
    shutil.rmtree(out, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "shoal", "data", "import", str(source), str(out), "--format", "csv"],
                   check=True)
    seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak <= before:
        raise RuntimeError("an earlier child used more memory: run each size in its own benchmark process")
    return seconds, peak * 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    args = parser.parse_args(argv)
    folder = WORK / "import"
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"table-{args.rows}.csv"
    if not source.exists():
        began = time.perf_counter()
        write_csv(source, args.rows)
        print(f"wrote {source} in {time.perf_counter() - began:.0f} s", flush=True)
    seconds, peak = import_once(source, folder / f"dataset-{args.rows}")
    size = source.stat().st_size
    info = machine()
    markdown = f"""# import: a {args.rows:,}-row CSV, {COLUMNS} numeric columns and a label

Machine: {machine_line(info)}. Command: `python -m benchmarks.import_csv --rows {args.rows}`.
Source: {size / 1e9:.2f} GB of text. One `shoal data import --format csv` in a fresh process.

| rows | seconds | rows / s | MB / s | peak resident memory |
| --- | --- | --- | --- | --- |
| {args.rows:,} | {seconds:.1f} | {args.rows / seconds:,.0f} | {size / 1e6 / seconds:.0f} | {peak / 2**20:.0f} MiB |

Target: peak resident memory under 1 GB (1024 MiB) at 10 million rows.
"""
    path = write_result(f"import-{args.rows}", markdown, {"machine": info, "rows": args.rows, "seconds": seconds,
                                                          "peak_bytes": peak, "source_bytes": size})
    print(markdown)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
