"""A training step of the user's own: what it may return, what the loop does with it, what it logs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional

from shoal.algorithms import make_algorithm
from shoal.cluster.collectives import Communicator
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader, owned
from shoal.errors import ConfigError, ShoalError
from shoal.train.held_out import combined as combined_held_out
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from shoal.train.step import Logged, Step, combined, evaluate_by_step, evaluate_rows
from shoal.train.transform import Transform
from tests.distributed.common import CLASSES, parameters, small_model, write_dataset


def plain_step(model, batch):
    inputs, labels = batch
    return functional.cross_entropy(model(inputs), labels)


def logging_step(model, batch):
    inputs, labels = batch
    outputs = model(inputs)
    loss = functional.cross_entropy(outputs, labels)
    return {"loss": loss, "mean_output": outputs.mean(), "rows": len(inputs)}


def train(tmp_path, step=None, transform=None, shuffle=True, epochs=2, accumulate=None):
    dataset = open_dataset(write_dataset(tmp_path / "data", rows=90))
    torch.manual_seed(0)
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    comm = Communicator(0, 1)
    algorithm = make_algorithm("sync", {})
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(dataset, rank=0, world_size=1, batch_size=16, seed=4, shuffle=shuffle)
    trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm,
                      step=step and Step(step), transform=transform, accumulate=accumulate)
    losses = [trainer.train_epoch(epoch).loss_sum for epoch in range(epochs)]
    return model, trainer, losses, loader


@pytest.mark.parametrize("accumulate", [None, 2])
def test_a_step_computing_the_loss_trains_as_the_built_in_loop(tmp_path, accumulate):
    built_in, _, built_in_losses, _ = train(tmp_path / "a", accumulate=accumulate)
    own, _, own_losses, _ = train(tmp_path / "b", step=plain_step, accumulate=accumulate)
    assert own_losses == built_in_losses
    for got, expected in zip(parameters(own), parameters(built_in), strict=True):
        assert torch.equal(got, expected)


def test_what_a_step_logs_is_summed_by_rows_over_the_epoch(tmp_path):
    _, trainer, losses, loader = train(tmp_path, step=logging_step, epochs=1)
    sums = trainer.logged.take()
    assert set(sums) == {"mean_output", "rows"}
    assert sums["rows"][1] == 90  # every row, once
    assert sums["rows"][0] == sum(len(labels) ** 2 for _, labels in loader.batches(0))
    assert trainer.logged.take() == {}  # taken: the next epoch starts afresh


def test_the_logged_means_weigh_every_rank_by_its_rows():
    first, second = Logged(), Logged()
    first.add({"a": 1.0, "b": 2.0}, 30)
    second.add({"a": 4.0}, 10)
    assert combined([first.take(), second.take()]) == {"a": (30 * 1.0 + 10 * 4.0) / 40, "b": 2.0}


@pytest.mark.parametrize("result,message", [
    ({"penalty": torch.tensor(1.0)}, r"returned a dict without \"loss\" \(keys: penalty\)"),
    (torch.ones(3), r"must return the loss .* got a tensor of shape \[3\]"),
    (3.0, r"must return the loss .* got float"),
    ({"loss": torch.tensor(1.0), "text": "x"}, r"'text' must be a number"),
])
def test_a_step_returning_something_else_is_one_line(result, message):
    with pytest.raises(ConfigError, match=f"^train.step: {message}"):
        Step(lambda model, batch: result)(None, None)


def test_an_exception_in_the_step_is_one_line_naming_it():
    def broken(model, batch):
        raise KeyError("input_ids")

    with pytest.raises(ShoalError, match=r"^train.step: KeyError: 'input_ids'$"):
        Step(broken)(None, None)
    with pytest.raises(ConfigError, match="^train.step: expected a function of"):
        Step("not a function")


def test_the_step_evaluates_the_test_rows_where_shoal_cannot_read_the_outputs(tmp_path):
    dataset = open_dataset(write_dataset(tmp_path / "data", rows=50))
    features, labels = dataset.read_all()
    loader = ShardLoader(dataset, rank=0, world_size=1, batch_size=16, seed=4)
    torch.manual_seed(0)
    model = small_model().train()
    by_step = evaluate_rows(model, None, Step(logging_step), features, labels, loader.to_tensors, batch_size=20)
    built_in = evaluate_rows(model, Objective("cross_entropy", CLASSES), None, features, labels, loader.to_tensors)
    assert model.training  # put back as it was
    assert by_step["loss"] == pytest.approx(built_in["loss"], rel=1e-6)
    inputs, targets = loader.to_tensors(features, labels)
    assert by_step["mean_output"] == pytest.approx(float(model.eval()(inputs).mean().detach()), rel=1e-5)
    assert by_step["rows"] == pytest.approx((20 * 20 + 20 * 20 + 10 * 10) / 50)
    assert set(built_in) >= {"loss", "accuracy"}
    assert evaluate_by_step(model, Step(plain_step), [((inputs, targets), 50)])["loss"] == pytest.approx(
        built_in["loss"], rel=1e-6)


def test_a_transform_changes_every_batch_and_never_the_stored_rows(tmp_path):
    seen = []

    def shift_in_place(batch):
        inputs, labels = batch
        inputs.add_(1.0)  # in place: on unshuffled rows, a view of the share
        seen.append(inputs.clone())
        return inputs, labels

    _, _, _, loader = train(tmp_path, step=plain_step, transform=Transform(shift_in_place, 0, 0), shuffle=False)
    stored = np.concatenate([inputs.numpy() for inputs, _ in loader.batches(0)])
    assert np.array_equal(np.concatenate([batch.numpy() for batch in seen[: len(seen) // 2]]), stored + 1.0)
    assert np.array_equal(np.concatenate([batch.numpy() for batch in seen[len(seen) // 2:]]), stored + 1.0)
    batch = {"x": torch.zeros(2)}
    assert owned(batch)["x"] is not batch["x"]


def test_the_held_out_metrics_are_means_weighted_by_rows():
    found = combined_held_out([{"loss": 1.0, "accuracy": 0.5, "rows": 30.0},
                               {"loss": 3.0, "accuracy": 1.0, "rows": 10.0}, {"rows": 0.0}])
    assert found == {"loss": 1.5, "accuracy": 0.625, "rows": 40.0}
    assert math.isnan(combined_held_out([{"loss": 1.0, "rows": 0.0}])["loss"])


def test_a_step_that_changes_its_batch_in_place_changes_no_stored_row(tmp_path):
    def shifting(model, batch):
        inputs, labels = batch
        inputs.add_(1.0)  # in place: the stored rows, were the batch a view of them
        return functional.cross_entropy(model(inputs), labels)

    _, trainer, _, loader = train(tmp_path, step=shifting, shuffle=False, epochs=2)
    stored = open_dataset(str(tmp_path / "data")).read_all()
    assert np.array_equal(loader.features, stored[0])
    evaluate_rows(trainer.model, None, Step(shifting), loader.features, loader.labels, loader.to_tensors)
    assert np.array_equal(loader.features, stored[0])


def test_evaluating_by_a_step_that_draws_leaves_the_trainings_random_numbers(tmp_path):
    def noisy(model, batch):
        inputs, labels = batch
        return functional.cross_entropy(model(inputs + torch.randn_like(inputs)), labels)

    dataset = open_dataset(write_dataset(tmp_path / "data", rows=50))
    loader = ShardLoader(dataset, rank=0, world_size=1, batch_size=16, seed=4)
    model = small_model()
    torch.manual_seed(7)
    first = evaluate_rows(model, None, Step(noisy), loader.features, loader.labels, loader.to_tensors)
    after = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(torch.rand(3), after)  # the evaluation drew from generators of its own
    assert evaluate_rows(model, None, Step(noisy), loader.features, loader.labels, loader.to_tensors) == first
