"""train.loss beyond the three built in: a torch.nn loss class by name, the user's own function, what
each refuses in one line, and the run directory's job.toml naming a function only runs it when trusted."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from shoal.api import resumed_job
from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.errors import ConfigError
from shoal.run.directory import write_job_file
from shoal.train.objective import Objective
from shoal.train.prepare import prepare
from shoal.train.runner import Runner
from tests.unit.train.test_runner import job, weights


def halved_cross_entropy(outputs, labels):
    return 0.5 * functional.cross_entropy(outputs, labels)


def trained(tmp_path, name: str, **train) -> dict:
    run_dir = tmp_path / name
    run_dir.mkdir()
    Runner(job(tmp_path, epochs=2, **train), DistInfo(), run_dir, threads=1, comm=Communicator(0, 1)).run()
    return weights(run_dir)


def test_a_torch_loss_by_name_trains_as_the_built_in_one(tmp_path):
    built_in = trained(tmp_path, "built-in", loss="cross_entropy")
    by_name = trained(tmp_path, "by-name", loss="CrossEntropyLoss")
    for key, tensor in built_in.items():
        assert torch.equal(tensor, by_name[key]), key


def test_the_users_function_is_imported_and_used(tmp_path):
    plain = trained(tmp_path, "plain", optimizer={"name": "sgd", "lr": 0.1})
    halved = trained(tmp_path, "halved", optimizer={"name": "sgd", "lr": 0.2},
                     loss=f"{__name__}:halved_cross_entropy")
    for key, tensor in plain.items():  # half the gradient at twice the rate: the same steps
        assert torch.allclose(tensor, halved[key], atol=1e-6), key


def test_one_logit_of_two_classes_reads_as_the_second_class():
    objective = Objective("BCEWithLogitsLoss", 2)
    outputs = torch.tensor([[2.0], [-1.0]])
    assert objective.accepts((1,)) and objective.accepts((2,)) and not objective.accepts((3,))
    assert objective.predictions(outputs).tolist() == [1, 0]
    assert torch.allclose(objective.probabilities(outputs)[:, 1], torch.sigmoid(outputs.reshape(-1)))
    expected = functional.binary_cross_entropy_with_logits(outputs.reshape(-1), torch.tensor([1.0, 0.0]))
    assert torch.isclose(objective(outputs, torch.tensor([1, 0])), expected)


@pytest.mark.parametrize("loss, message", [
    ("hinge", "train.loss: unknown loss 'hinge'"),
    ("SmoothL1Los", "unknown loss 'SmoothL1Los'"),
    ("SmoothL1Loss", "train.loss: 'SmoothL1Loss' fails on the model's outputs \\[2, 3\\]"),
    ("no_such_module:loss", "train.loss: cannot import 'no_such_module:loss'"),
])
def test_a_loss_that_cannot_work_is_one_line_before_any_worker(tmp_path, loss, message):
    with pytest.raises(ConfigError, match=message) as raised:
        prepare(job(tmp_path, loss=loss))
    assert "\n" not in str(raised.value)


def test_a_run_directory_naming_a_loss_function_is_refused_unless_trusted(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_job_file(run_dir, job(tmp_path, loss="os:system"))
    with pytest.raises(ConfigError, match="train.loss 'os:system'"):
        resumed_job(run_dir)
    assert resumed_job(run_dir, trust_code=True).train.loss == "os:system"
