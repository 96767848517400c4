"""The trained model in a run directory: saving, loading and predicting with it.

`model.pt` holds the weights together with the model spec, the loss and the classes, so a run
directory alone is enough to rebuild the module and turn its outputs into labels. It is
written under a temporary name and renamed, and read with `weights_only=True`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch

from shoal.data.format import open_dataset
from shoal.data.loader import feature_scale
from shoal.errors import DataError, ShoalError
from shoal.model import build_model
from shoal.train.objective import Objective

MODEL_FILE = "model.pt"


def save_model(run_dir: str | Path, model: torch.nn.Module, spec: dict, objective: Objective,
               classes: list | None, feature_dtype: str) -> Path:
    path = Path(run_dir) / MODEL_FILE
    temporary = path.with_suffix(".pt.tmp")
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save({"spec": spec, "state_dict": state, "loss": objective.loss, "classes": classes,
                "feature_dtype": feature_dtype}, temporary)
    os.replace(temporary, path)
    return path


def load_artifact(run_dir: str | Path) -> dict:
    path = Path(run_dir) / MODEL_FILE
    if not path.exists():
        raise ShoalError(f"{path}: no trained model (did the job finish?)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several kinds for a damaged file
        raise ShoalError(f"{path}: cannot load model: {error}") from None


def load_model(run_dir: str | Path) -> torch.nn.Module:
    """The trained module of a run, in eval mode, on the CPU."""
    artifact = load_artifact(run_dir)
    model = build_model(artifact["spec"])
    model.load_state_dict(artifact["state_dict"])
    return model.eval()


@torch.no_grad()
def predict(run_dir: str | Path, dataset_path: str, out: str | Path, batch_size: int = 8192) -> int:
    """Write one row per sample (prediction, class probabilities, true label) to Parquet or CSV."""
    artifact = load_artifact(run_dir)
    model = build_model(artifact["spec"])
    model.load_state_dict(artifact["state_dict"])
    model.eval()
    classes = artifact["classes"]
    objective = Objective(artifact["loss"], None if classes is None else len(classes))
    dataset = open_dataset(dataset_path)
    input_shape = artifact["spec"]["input"]
    if dataset.features != int(np.prod(input_shape)):
        raise DataError(f"{dataset_path}: {dataset.features} features, but the model takes {input_shape}")
    features, labels = dataset.read_all()
    scale = feature_scale(features.dtype)
    predicted, probabilities = [], []
    for start in range(0, len(features), batch_size):
        inputs = torch.from_numpy(features[start : start + batch_size]).float().mul_(scale)
        outputs = model(inputs.reshape(len(inputs), *input_shape))
        predicted.append(objective.predictions(outputs).numpy())
        probability = objective.probabilities(outputs)
        if probability is not None:
            probabilities.append(probability.numpy())
    columns: dict[str, np.ndarray] = {}
    predicted_index = np.concatenate(predicted)
    if classes is not None:
        names = np.asarray(classes)
        columns["prediction"] = names[predicted_index]
        stacked = np.concatenate(probabilities)
        for index, name in enumerate(classes):
            columns[f"probability_{name}"] = stacked[:, index]
        if dataset.classes is not None:
            columns["label"] = np.asarray(dataset.classes)[labels]
    else:
        columns["prediction"] = predicted_index
        columns["label"] = labels
    table = pa.table(columns)
    out = Path(out)
    if not out.parent.is_dir():
        raise ShoalError(f"--out: folder {out.parent} does not exist")
    temporary = out.with_name(f".{out.name}.tmp")
    try:
        if out.suffix == ".csv":
            pacsv.write_csv(table, temporary)
        else:
            pq.write_table(table, temporary)
        os.replace(temporary, out)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise ShoalError(f"{out}: cannot write predictions: {error}") from None
    return len(features)
