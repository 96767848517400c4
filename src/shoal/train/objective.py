"""Losses and how model outputs become predictions, scores and metrics.

One place decides what the model's outputs mean for each loss, so training, evaluation and
`shoal predict` agree: cross_entropy takes one logit per class, binary_cross_entropy one logit
for class 1, mse regresses one-hot targets (classification) or the label (regression).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional

from shoal.errors import ConfigError


class Objective:
    """A loss plus the interpretation of outputs that goes with it."""

    def __init__(self, loss: str, num_classes: int | None):
        self.loss, self.num_classes = loss, num_classes
        if loss not in ("cross_entropy", "binary_cross_entropy", "mse"):
            raise ConfigError(f"train.loss: unknown loss {loss!r}")
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

    def __call__(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
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
        if self.loss == "binary_cross_entropy":
            positive = torch.sigmoid(outputs.reshape(-1))
            return torch.stack([1 - positive, positive], dim=1)
        if self.loss == "cross_entropy":
            return torch.softmax(outputs, dim=1)
        weights = outputs.clamp(min=0) + 1e-12  # a row of outputs all <= 0 reads as uniform
        return weights / weights.sum(dim=1, keepdim=True)

    def predictions(self, outputs: torch.Tensor) -> torch.Tensor:
        if self.num_classes is None:
            return outputs.reshape(-1)
        if self.loss == "binary_cross_entropy":
            return (outputs.reshape(-1) > 0).long()
        return outputs.argmax(dim=1)


def metrics(objective: Objective, loss_sum: float, rows: int, labels: np.ndarray, predictions: np.ndarray,
            positive_scores: np.ndarray | None) -> dict[str, float]:
    """Loss and accuracy (and ROC AUC for two classes) of a pass over a dataset."""
    result = {"loss": loss_sum / rows}
    if objective.num_classes is not None:
        result["accuracy"] = float(np.mean(predictions == labels))
        from sklearn.metrics import roc_auc_score  # imported here: sklearn takes a second to import

        if objective.num_classes == 2 and positive_scores is not None and len(np.unique(labels)) == 2:
            result["auc"] = float(roc_auc_score(labels, positive_scores))
    else:
        result["rmse"] = float(np.sqrt(np.mean((predictions - labels) ** 2)))
    return result


@torch.no_grad()
def evaluate(model: torch.nn.Module, objective: Objective, features: np.ndarray, labels: np.ndarray,
             convert, batch_size: int = 8192) -> dict[str, float]:
    """Metrics of the model on in-memory rows; `convert` turns numpy rows into tensors."""
    was_training = model.training
    model.eval()
    loss_sum, predicted, scores = 0.0, [], []
    for start in range(0, len(features), batch_size):
        inputs, targets = convert(features[start : start + batch_size], labels[start : start + batch_size])
        outputs = model(inputs)
        loss_sum += float(objective(outputs, targets)) * len(inputs)
        predicted.append(objective.predictions(outputs).cpu().numpy())
        probabilities = objective.probabilities(outputs)
        if probabilities is not None and probabilities.shape[1] == 2:
            scores.append(probabilities[:, 1].cpu().numpy())
    model.train(was_training)
    return metrics(objective, loss_sum, len(features), labels, np.concatenate(predicted),
                   np.concatenate(scores) if scores else None)
