"""Losses and how model outputs become predictions, scores and metrics.

One place decides what the model's outputs mean for each loss, so training, evaluation and
`shoal predict` agree: cross_entropy takes one logit per class, binary_cross_entropy one logit
for class 1, mse regresses one-hot targets (classification) or the label (regression).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from shoal.code import is_reference, load_code
from shoal.errors import ConfigError

BUILT_IN = ("cross_entropy", "binary_cross_entropy", "mse")


def torch_losses() -> dict[str, type]:
    return {name: cls for name, cls in vars(nn).items()
            if inspect.isclass(cls) and issubclass(cls, nn.modules.loss._Loss) and not name.startswith("_")}


def check_loss_name(loss: str) -> None:
    """A built-in name, a torch.nn loss class, or 'package.module:function' (imported only when used)."""
    if loss in BUILT_IN or loss in torch_losses() or is_reference(loss):
        return
    close = difflib.get_close_matches(loss, [*BUILT_IN, *torch_losses()], n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise ConfigError(f"train.loss: unknown loss {loss!r}{hint}; give one of {', '.join(BUILT_IN)}, a torch.nn "
                      "loss class or 'package.module:function'")


def user_loss(loss: str, run_dir=None) -> Callable:
    """The loss function a name gives: a torch.nn class (built with its defaults), the user's function, or the
    callable `shoal.fit(loss=...)` wrote into the run directory (a loss object, such as a weighted
    CrossEntropyLoss, or a function)."""
    if not is_reference(loss):
        return torch_losses()[loss]()
    function = load_code(loss, "train.loss", run_dir)
    if not callable(function):
        raise ConfigError(f"train.loss: {loss!r} is a {type(function).__name__}, not a function of "
                          "(outputs, labels)")
    return function


class Objective:
    """A loss plus the interpretation of outputs that goes with it.

    A loss besides the three built in (a torch.nn class or the user's function) reads outputs as class
    logits when the data has classes (one output: the logit of the second class of two) and as the
    value itself for a numeric label; its function is imported on first use only, so predicting with a
    saved model never runs it.
    """

    def __init__(self, loss: str, num_classes: int | None, run_dir=None):
        self.loss, self.num_classes, self.run_dir = loss, num_classes, run_dir
        check_loss_name(loss)
        self.custom = loss not in BUILT_IN
        self._function = None
        if self.custom:
            return
        if num_classes is None and loss != "mse":
            raise ConfigError(f"train.loss: {loss!r} needs class labels; the training set has none (use 'mse')")
        if loss == "binary_cross_entropy" and num_classes != 2:
            raise ConfigError(f"train.loss: binary_cross_entropy needs 2 classes, the training set has {num_classes}")

    @property
    def label_dtype(self) -> torch.dtype:
        return torch.float32 if self.num_classes is None else torch.int64

    def expected_outputs(self) -> int:
        if self.loss == "binary_cross_entropy" or self.num_classes is None:
            return 1
        return self.num_classes

    def accepts(self, shape: tuple[int, ...]) -> bool:
        """Whether one sample's outputs of this shape fit the loss and the labels."""
        if self.custom and self.num_classes == 2 and shape == (1,):
            return True
        return shape == (self.expected_outputs(),)

    def one_logit(self, outputs: torch.Tensor) -> bool:
        return self.loss == "binary_cross_entropy" or (self.custom and outputs.ndim == 2 and outputs.shape[1] == 1)

    def __call__(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.custom:
            self._function = self._function or user_loss(self.loss, self.run_dir)
            if self.num_classes is None or self.one_logit(outputs):
                return self._function(outputs.reshape(-1), labels.float())
            return self._function(outputs, labels)
        if self.loss == "cross_entropy":
            return functional.cross_entropy(outputs, labels)
        if self.loss == "binary_cross_entropy":
            return functional.binary_cross_entropy_with_logits(outputs.reshape(-1), labels.float())
        if self.num_classes is None:
            return functional.mse_loss(outputs.reshape(-1), labels)
        return functional.mse_loss(outputs, functional.one_hot(labels, self.num_classes).float())

    def probabilities(self, outputs: torch.Tensor) -> torch.Tensor | None:
        """Class probabilities (n, K), or None for regression."""
        if self.num_classes is None:
            return None
        if self.one_logit(outputs):
            positive = torch.sigmoid(outputs.reshape(-1))
            return torch.stack([1 - positive, positive], dim=1)
        if self.loss == "cross_entropy" or self.custom:
            return torch.softmax(outputs, dim=1)
        weights = outputs.clamp(min=0) + 1e-12  # a row of outputs all <= 0 reads as uniform
        return weights / weights.sum(dim=1, keepdim=True)

    def predictions(self, outputs: torch.Tensor) -> torch.Tensor:
        if self.num_classes is None:
            return outputs.reshape(-1)
        if self.one_logit(outputs):
            return (outputs.reshape(-1) > 0).long()
        return outputs.argmax(dim=1)


BUILT_IN_METRICS = ("loss", "accuracy", "auc", "rmse")
"""Every name `built_in_metrics` can give: the user's own metrics (`train.metrics`) take other names."""


def built_in_metrics(objective: Objective, loss_sum: float, rows: int, labels: np.ndarray, predictions: np.ndarray,
                     positive_scores: np.ndarray | None) -> dict[str, float]:
    """Loss and accuracy (and ROC AUC for two classes) of a pass over a dataset."""
    result = {"loss": loss_sum / rows}
    if objective.num_classes is not None:
        result["accuracy"] = float(np.mean(predictions == labels))
        if objective.num_classes == 2 and positive_scores is not None and len(np.unique(labels)) == 2:
            result["auc"] = roc_auc(labels, positive_scores)
    else:
        result["rmse"] = float(np.sqrt(np.mean((predictions - labels) ** 2)))
    return result


def metric_names(objective: Objective, user: Sequence[str] = ()) -> tuple[str, ...]:
    """The keys `evaluate` can give for this objective (auc only when the labels hold both classes), then
    the names of the user's own metrics (`train.metrics`), `user`."""
    if objective.num_classes is None:
        found = ("loss", "rmse")
    else:
        found = ("loss", "accuracy", "auc") if objective.num_classes == 2 else ("loss", "accuracy")
    return (*found, *user)


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve of class 1 against class 0: the chance that a random positive row
    scores above a random negative one, ties counting half (the Mann-Whitney U over both counts).

    NumPy rather than scikit-learn: importing sklearn.metrics (and scipy) costs every job's
    coordinator more than a second of start-up, which short jobs and scaling studies feel.
    """
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based; tied scores share their mean rank
    positive = labels == 1
    positives = int(np.count_nonzero(positive))
    negatives = len(labels) - positives
    rank_sum = float(average_rank[inverse.reshape(-1)][positive].sum())
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


EVALUATE_ROWS = 8192  # rows evaluated in one forward pass


@torch.no_grad()
def evaluate(model: torch.nn.Module, objective: Objective, features: np.ndarray, labels: np.ndarray,
             convert, batch_size: int = EVALUATE_ROWS, metrics=None) -> dict[str, float]:
    """Metrics of the model on in-memory rows; `convert` turns numpy rows into tensors. `metrics`: the user's
    own (a `shoal.train.user_metrics.UserMetrics`), fed every batch's outputs and computed after the
    built-in ones, under their own names."""
    was_training = model.training
    model.eval()
    loss_sum, predicted, scores = 0.0, [], []
    if metrics is not None:
        metrics.start()
    try:
        for start in range(0, len(features), batch_size):
            inputs, targets = convert(features[start : start + batch_size], labels[start : start + batch_size])
            outputs = model(inputs)
            loss_sum += float(objective(outputs, targets)) * len(inputs)
            predicted.append(objective.predictions(outputs).cpu().numpy())
            probabilities = objective.probabilities(outputs)
            if probabilities is not None and probabilities.shape[1] == 2:
                scores.append(probabilities[:, 1].cpu().numpy())
            if metrics is not None:
                metrics.update(outputs, targets)
    finally:
        model.train(was_training)
    found = built_in_metrics(objective, loss_sum, len(features), labels, np.concatenate(predicted),
                             np.concatenate(scores) if scores else None)
    return found | (metrics.compute() if metrics is not None else {})
