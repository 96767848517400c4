"""Predictions at scale: a trained model over a dataset of any size, in bounded memory, by N processes.

Each process takes a contiguous range of rows, reads it from the store a batch at a time (never
the whole dataset), and writes its predictions to a part file as it goes; the parts are then
copied in order, a row group at a time, into the output, which is renamed into place only when
whole. Rows keep the dataset's order. Columns: the prediction (the class, or the value for a
regression), one probability column per class, and the label where the dataset has labels.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch

from shoal.cluster.orphan import die_with_parent
from shoal.config import parse_size
from shoal.data import leftovers
from shoal.data.format import Dataset, open_dataset
from shoal.data.loader import feature_scale
from shoal.durable import replace_durably
from shoal.errors import ShoalError, first_line
from shoal.inference.predict_rows import dataset_on_disk
from shoal.model import Trust
from shoal.run.artifacts import MODEL_FILE, TRAINING_SET, check_dataset, check_out, load_artifact, rebuild
from shoal.train.objective import Objective

BATCH_ROWS = 8192  # rows per batch at most, whatever the memory budget allows
BYTES_PER_FEATURE = 16  # a batch's stored features, their float copy, the model's activations: a rough bound


def batch_rows(dataset: Dataset, memory: int | str | None) -> int:
    """Rows per batch: BATCH_ROWS, fewer where the memory budget says so."""
    if memory is None:
        return BATCH_ROWS
    budget = parse_size("--memory", memory)
    return max(1, min(BATCH_ROWS, budget // (dataset.features * BYTES_PER_FEATURE)))


def block_columns(model: torch.nn.Module, artifact: dict, objective: Objective, dataset: Dataset,
                  features: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """The prediction columns of one batch of stored rows (flat features, raw labels)."""
    inputs = torch.from_numpy(features).float().mul_(feature_scale(features.dtype))
    outputs = model(inputs.reshape(len(inputs), *artifact["spec"]["input"]))
    classes = artifact["classes"]
    predicted = objective.predictions(outputs).numpy()
    columns = {"prediction": predicted if classes is None else np.asarray(classes)[predicted]}
    probabilities = objective.probabilities(outputs)
    if classes is not None and probabilities is not None:
        for index, name in enumerate(classes):
            columns[f"probability_{name}"] = probabilities[:, index].numpy()
    if dataset.labeled:
        columns["label"] = labels
    return columns


@torch.no_grad()
def predict_range(run_dir: str, dataset_path: str, start: int, stop: int, part: str, rows_per_batch: int,
                  trust_code: Trust, threads: int | None = None) -> int:
    """Rows [start, stop) of the dataset into the Parquet file `part`, a batch at a time; the rows written."""
    if threads:
        torch.set_num_threads(threads)
    artifact = load_artifact(run_dir)
    model = rebuild(artifact, Path(run_dir) / MODEL_FILE, trust_code)
    dataset = open_dataset(dataset_path)
    classes = artifact["classes"]
    objective = Objective(artifact["loss"], None if classes is None else len(classes))
    writer, written = None, 0
    try:
        for _, features, labels in dataset.iter_rows(start, stop, max_rows=rows_per_batch, finite=True):
            table = pa.table(block_columns(model, artifact, objective, dataset, features, labels))
            writer = writer or pq.ParquetWriter(part, table.schema)
            writer.write_table(table.cast(writer.schema))
            written += table.num_rows
    finally:
        if writer is not None:
            writer.close()
    return written


def ranges(rows: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous, nearly equal row ranges, one per worker (no empty ones)."""
    size = math.ceil(rows / workers)
    return [(start, min(start + size, rows)) for start in range(0, rows, size)]


def predict(run_dir: str | Path, dataset, out: str | Path, batch_size: int | None = None, *,
            overwrite: bool = False, trust_code: Trust = False, workers: int = 1,
            memory: int | str | None = None) -> int:
    """Write one row per sample (prediction, class probabilities, true label when known) to Parquet or CSV.

    `dataset`: a dataset folder, or rows in memory: an array or tensor of features (one row per
    sample, the model's features in order), or a (features, labels) pair. It must match the model's
    training set (dtype, shape, feature names, encoding); `out` is replaced only with `overwrite`, and
    never lies inside the run directory. A model built by code runs code from the run directory:
    refused unless `trust_code`. `workers` processes share the rows; `memory` bounds what each holds
    at once (bytes, or "256MB"). Returns the rows predicted.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ShoalError(f"--workers: must be an integer >= 1, got {workers!r}")
    out = check_out(run_dir, out, overwrite)
    artifact = load_artifact(run_dir)
    rebuild(artifact, Path(run_dir) / MODEL_FILE, trust_code)  # refused here, before anything else, unless trusted
    reference = artifact.get(TRAINING_SET) if isinstance(artifact.get(TRAINING_SET), dict) else {}
    with dataset_on_disk(dataset, reference) as dataset_path:
        opened = open_dataset(dataset_path)
        check_dataset(artifact, opened, Path(run_dir) / MODEL_FILE)
        if opened.fields:  # its model takes what the user's step made of the fields: only that code knows
            names = ", ".join(field["name"] for field in opened.fields)
            raise ShoalError(f"{dataset_path if isinstance(dataset, (str, Path)) else 'the rows given'}: rows of "
                             f"named fields ({names}) are fed to the model by the training step, which shoal "
                             "predict does not run: load the model with shoal.load_model and call it yourself")
        rows_per_batch = min(batch_size or BATCH_ROWS, batch_rows(opened, memory))
        leftovers.sweep(str(out.parent), f".{out.name}.")  # what a killed predict left beside `out`
        parts = owned_folder(out)
        try:
            shares = ranges(opened.rows, workers)
            names = [str(parts / f"part-{index:05d}.parquet") for index in range(len(shares))]
            run_parts(str(run_dir), dataset_path, shares, names, rows_per_batch, trust_code)
            join_parts(names, out, overwrite)
        finally:
            shutil.rmtree(parts, ignore_errors=True)
    return opened.rows


def owned_folder(out: Path) -> Path:
    """A new folder beside `out` for the parts: a name no one can foresee, made here (never one already
    there, nor a link's target), that says whose it is, so the next predict to `out` sweeps it once this
    process is gone (shoal.data.leftovers)."""
    parts = out.with_name(leftovers.owned_name(f".{out.name}.parts"))
    try:
        parts.mkdir(mode=0o700)
    except OSError as error:
        raise ShoalError(f"{out}: cannot write predictions beside it: {first_line(error)}") from None
    return parts


def run_parts(run_dir: str, dataset_path: str, shares: list[tuple[int, int]], names: list[str],
              rows_per_batch: int, trust_code: Trust) -> None:
    """Each range by its own process (here, with one range)."""
    work = [(run_dir, dataset_path, start, stop, name, rows_per_batch, trust_code)
            for (start, stop), name in zip(shares, names, strict=True)]
    if len(work) == 1:
        predict_range(*work[0])
        return
    threads = max(1, (os.cpu_count() or 1) // len(work))
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited threads or locks
    # each worker ends with this process, however it ends (a SIGKILL included), so none predicts on alone
    with ProcessPoolExecutor(max_workers=len(work), mp_context=context, initializer=die_with_parent,
                             initargs=(os.getpid(),)) as pool:
        for result in [pool.submit(predict_range, *arguments, threads) for arguments in work]:
            result.result()


def join_parts(names: list[str], out: Path, overwrite: bool) -> None:
    """The parts, in order and a row group at a time, into `out` under a temporary name, then renamed."""
    temporary = out.with_name(leftovers.owned_name(f".{out.name}"))
    try:
        # made here, exclusively and under a name no one can foresee: never a file or link planted before
        handle = os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666), "wb")
    except OSError as error:
        raise ShoalError(f"{out}: cannot write predictions: {first_line(error)}") from None
    try:
        with handle:
            _write_parts(names, out, handle)
        if not overwrite and (out.exists() or out.is_symlink()):  # appeared while predicting
            raise ShoalError(f"{out}: already exists; pass --overwrite (overwrite=True) to replace it")
        replace_durably(temporary, out)
    except (OSError, pa.ArrowException) as error:
        raise ShoalError(f"{out}: cannot write predictions: {first_line(error)}") from None
    finally:
        temporary.unlink(missing_ok=True)


def _write_parts(names: list[str], out: Path, handle) -> None:
    """The parts' row groups, in order, into the open file `handle`, as CSV or Parquet as `out` is named."""
    writer, schema = None, None
    for name in names:
        part = pq.ParquetFile(name)
        for group in range(part.num_row_groups):
            table = part.read_row_group(group)
            if writer is None:
                schema = table.schema  # the first part's; a later one may type a column with nulls apart
                writer = (pacsv.CSVWriter(handle, schema) if out.suffix == ".csv"
                          else pq.ParquetWriter(handle, schema))
            writer.write_table(table.cast(schema))
    writer.close()
