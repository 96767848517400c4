"""Objectives: loss values, predictions, probabilities and metrics against independent references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, mean_squared_error, roc_auc_score
from torch.nn import functional

from shoal.errors import ConfigError
from shoal.train.objective import Objective, evaluate, roc_auc


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(0)


def convert(features: np.ndarray, labels: np.ndarray, dtype=torch.int64):
    return torch.from_numpy(features).float(), torch.from_numpy(labels).to(dtype)


# ---------------------------------------------------------------- construction


def test_binary_cross_entropy_needs_two_classes():
    with pytest.raises(ConfigError) as caught:
        Objective("binary_cross_entropy", 3)
    assert str(caught.value).startswith("train.loss:") and "2 classes" in str(caught.value)


@pytest.mark.parametrize("loss", ["cross_entropy", "binary_cross_entropy"])
def test_class_losses_need_class_labels(loss):
    with pytest.raises(ConfigError, match="^train.loss:"):
        Objective(loss, None)


@pytest.mark.parametrize(
    ("loss", "classes", "outputs", "dtype"),
    [("cross_entropy", 5, 5, torch.int64), ("binary_cross_entropy", 2, 1, torch.int64),
     ("mse", 4, 4, torch.int64), ("mse", None, 1, torch.float32)],
)
def test_expected_outputs_and_label_dtype(loss, classes, outputs, dtype):
    objective = Objective(loss, classes)
    assert objective.expected_outputs() == outputs
    assert objective.label_dtype == dtype


# ---------------------------------------------------------------- loss values


def test_cross_entropy_loss(generator):
    outputs = torch.randn(16, 4, generator=generator)
    labels = torch.randint(0, 4, (16,), generator=generator)
    expected = -torch.log_softmax(outputs, dim=1)[torch.arange(16), labels].mean()
    loss = Objective("cross_entropy", 4)(outputs, labels)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(loss, functional.cross_entropy(outputs, labels))


def test_binary_cross_entropy_loss(generator):
    outputs = torch.randn(16, 1, generator=generator)
    labels = torch.randint(0, 2, (16,), generator=generator)
    p = torch.sigmoid(outputs.reshape(-1))
    expected = -(labels * torch.log(p) + (1 - labels) * torch.log(1 - p)).mean()
    torch.testing.assert_close(Objective("binary_cross_entropy", 2)(outputs, labels), expected)


def test_mse_on_classes_regresses_one_hot_targets(generator):
    outputs = torch.randn(10, 3, generator=generator)
    labels = torch.randint(0, 3, (10,), generator=generator)
    targets = torch.zeros(10, 3)
    targets[torch.arange(10), labels] = 1
    expected = ((outputs - targets) ** 2).mean()
    torch.testing.assert_close(Objective("mse", 3)(outputs, labels), expected)


def test_mse_regression(generator):
    outputs = torch.randn(10, 1, generator=generator)
    labels = torch.randn(10, generator=generator)
    expected = ((outputs.reshape(-1) - labels) ** 2).mean()
    loss = Objective("mse", None)(outputs, labels)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(loss, functional.mse_loss(outputs.reshape(-1), labels))


# ---------------------------------------------------------------- predictions and probabilities


def test_cross_entropy_predictions_and_probabilities(generator):
    outputs = torch.randn(12, 5, generator=generator)
    objective = Objective("cross_entropy", 5)
    np.testing.assert_array_equal(objective.predictions(outputs).numpy(), outputs.numpy().argmax(axis=1))
    probabilities = objective.probabilities(outputs)
    assert probabilities.shape == (12, 5)
    torch.testing.assert_close(probabilities.sum(dim=1), torch.ones(12))
    exp = np.exp(outputs.numpy() - outputs.numpy().max(axis=1, keepdims=True))
    np.testing.assert_allclose(probabilities.numpy(), exp / exp.sum(axis=1, keepdims=True), rtol=1e-5)


def test_binary_predictions_and_probabilities():
    outputs = torch.tensor([[-2.0], [0.5], [3.0], [-0.1]])
    objective = Objective("binary_cross_entropy", 2)
    assert objective.predictions(outputs).tolist() == [0, 1, 1, 0]
    probabilities = objective.probabilities(outputs)
    positive = 1 / (1 + np.exp(-outputs.numpy().reshape(-1)))
    np.testing.assert_allclose(probabilities.numpy(), np.stack([1 - positive, positive], axis=1), rtol=1e-6)
    torch.testing.assert_close(probabilities.sum(dim=1), torch.ones(4))


def test_mse_class_predictions_and_probabilities():
    outputs = torch.tensor([[0.2, 0.9, -0.3], [1.0, 0.5, 0.5], [-1.0, 0.0, 3.0]])
    objective = Objective("mse", 3)
    assert objective.predictions(outputs).tolist() == [1, 0, 2]
    probabilities = objective.probabilities(outputs)
    torch.testing.assert_close(probabilities.sum(dim=1), torch.ones(3))
    torch.testing.assert_close(probabilities[0], torch.tensor([0.2, 0.9, 0.0]) / 1.1)
    torch.testing.assert_close(probabilities[2], torch.tensor([0.0, 0.0, 1.0]))


def test_mse_probabilities_sum_to_one_when_every_output_is_negative():
    probabilities = Objective("mse", 3).probabilities(torch.tensor([[-0.5, -0.1, -2.0]]))
    torch.testing.assert_close(probabilities.sum(dim=1), torch.ones(1))


def test_regression_predictions_and_no_probabilities():
    outputs = torch.tensor([[1.5], [-2.0], [0.25]])
    objective = Objective("mse", None)
    assert objective.probabilities(outputs) is None
    assert objective.predictions(outputs).tolist() == [1.5, -2.0, 0.25]


# ---------------------------------------------------------------- evaluate against sklearn


def tiny_model(inputs: int, outputs: int) -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(inputs, 6), torch.nn.Tanh(), torch.nn.Dropout(0.5),
                               torch.nn.Linear(6, outputs))


@pytest.fixture
def binary_data():
    rng = np.random.default_rng(1)
    features = rng.normal(size=(203, 4)).astype(np.float32)
    labels = (features[:, 0] + 0.5 * rng.normal(size=203) > 0).astype(np.int64)
    return features, labels


@pytest.mark.parametrize("loss", ["cross_entropy", "binary_cross_entropy", "mse"])
def test_evaluate_two_classes_matches_sklearn(binary_data, loss):
    features, labels = binary_data
    objective = Objective(loss, 2)
    model = tiny_model(4, objective.expected_outputs())
    model.train()
    metrics = evaluate(model, objective, features, labels, convert, batch_size=50)  # five uneven batches
    assert model.training  # evaluate restores the mode it found
    model.eval()
    with torch.no_grad():
        outputs = model(torch.from_numpy(features))
    targets = torch.from_numpy(labels)
    if loss == "cross_entropy":
        expected_loss = functional.cross_entropy(outputs, targets)
        predicted = outputs.argmax(dim=1).numpy()
        scores = torch.softmax(outputs, dim=1)[:, 1].numpy()
    elif loss == "binary_cross_entropy":
        expected_loss = functional.binary_cross_entropy_with_logits(outputs.reshape(-1), targets.float())
        predicted = (outputs.reshape(-1) > 0).long().numpy()
        scores = torch.sigmoid(outputs.reshape(-1)).numpy()
    else:
        expected_loss = functional.mse_loss(outputs, functional.one_hot(targets, 2).float())
        predicted = outputs.argmax(dim=1).numpy()
        positive = outputs.clamp(min=0) + 1e-12  # rows of outputs all <= 0 read as uniform
        scores = (positive[:, 1] / positive.sum(dim=1)).numpy()
    assert set(metrics) == {"loss", "accuracy", "auc"}
    assert metrics["loss"] == pytest.approx(float(expected_loss), rel=1e-5)
    assert metrics["accuracy"] == pytest.approx(accuracy_score(labels, predicted))
    assert metrics["auc"] == pytest.approx(roc_auc_score(labels, scores), rel=1e-6)


def test_evaluate_many_classes_has_no_auc():
    rng = np.random.default_rng(2)
    features = rng.normal(size=(90, 4)).astype(np.float32)
    labels = rng.integers(0, 3, size=90)
    objective = Objective("cross_entropy", 3)
    model = tiny_model(4, 3)
    metrics = evaluate(model, objective, features, labels, convert, batch_size=32)
    with torch.no_grad():
        outputs = model.eval()(torch.from_numpy(features))
    assert set(metrics) == {"loss", "accuracy"}
    expected_loss = functional.cross_entropy(outputs, torch.from_numpy(labels))
    assert metrics["loss"] == pytest.approx(float(expected_loss), rel=1e-5)
    assert metrics["accuracy"] == pytest.approx(accuracy_score(labels, outputs.argmax(dim=1).numpy()))


def test_evaluate_one_class_present_has_no_auc(binary_data):
    features, _ = binary_data
    labels = np.ones(len(features), dtype=np.int64)
    metrics = evaluate(tiny_model(4, 2), Objective("cross_entropy", 2), features, labels, convert)
    assert "auc" not in metrics and "accuracy" in metrics


def test_evaluate_regression_gives_rmse():
    rng = np.random.default_rng(3)
    features = rng.normal(size=(77, 4)).astype(np.float32)
    targets = rng.normal(size=77).astype(np.float32)
    objective = Objective("mse", None)
    model = tiny_model(4, 1)
    metrics = evaluate(model, objective, features, targets,
                       lambda f, t: convert(f, t, torch.float32), batch_size=20)
    with torch.no_grad():
        outputs = model.eval()(torch.from_numpy(features)).reshape(-1).numpy()
    assert set(metrics) == {"loss", "rmse"}
    assert metrics["loss"] == pytest.approx(mean_squared_error(targets, outputs), rel=1e-5)
    assert metrics["rmse"] == pytest.approx(np.sqrt(mean_squared_error(targets, outputs)), rel=1e-5)


def test_roc_auc_matches_scikit_learn_with_ties_and_float32_scores():
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 2, size=500)
    tied = np.round(rng.normal(size=500) + labels, 1)  # many tied scores across both classes
    for scores in (tied, tied.astype(np.float32), rng.random(500).astype(np.float32), labels * 1.0):
        assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), rel=1e-12)
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == 0.75
