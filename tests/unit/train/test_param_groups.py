"""train.optimizer.param_groups: parameters picked by name into groups with their own settings.

Each group's `params` is searched in the names `named_parameters()` gives; a parameter joins the first
group that matches it, the rest form a last group with the top-level settings. The order is fixed by
the job, so an optimizer's state_dict loads back into one built again (a resume). Every bad group is
one line naming its key.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.errors import ConfigError
from shoal.train.prepare import check_optimizer, make_optimizer, prepare
from shoal.train.runner import Runner
from shoal.train.state import load_optimizer
from tests.unit.train.test_runner import job, weights


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))  # 0.weight, 0.bias, 2.weight, 2.bias


def names_of(built: torch.optim.Optimizer, module: nn.Module) -> list[list[str]]:
    """The parameter names of each param group, in order."""
    name = {id(parameter): key for key, parameter in module.named_parameters()}
    return [[name[id(parameter)] for parameter in group["params"]] for group in built.param_groups]


def test_a_parameter_joins_the_first_group_that_matches_it_and_the_rest_come_last():
    module = model()
    built = make_optimizer({"name": "sgd", "lr": 0.1, "momentum": 0.9, "param_groups": [
        {"params": "^0\\.", "lr": 0.2}, {"params": "bias$", "weight_decay": 0.01}]}, module)
    assert names_of(built, module) == [["0.weight", "0.bias"], ["2.bias"], ["2.weight"]]
    settings = [(group["lr"], group["momentum"], group["weight_decay"]) for group in built.param_groups]
    assert settings == [(0.2, 0.9, 0), (0.1, 0.9, 0.01), (0.1, 0.9, 0)]  # unset keys are the top level's


def test_without_parameters_left_there_is_no_last_group():
    module = model()
    built = make_optimizer({"name": "adam", "lr": 0.01, "param_groups": [{"params": "weight"}, {"params": "bias",
                                                                                                 "lr": 0.1}]}, module)
    assert names_of(built, module) == [["0.weight", "2.weight"], ["0.bias", "2.bias"]]


def test_each_group_steps_with_its_own_rate():
    module = model()
    before = {name: tensor.detach().clone() for name, tensor in module.named_parameters()}
    built = make_optimizer({"name": "sgd", "lr": 0.1, "param_groups": [{"params": "^2\\.", "lr": 0.5}]}, module)
    for parameter in module.parameters():
        parameter.grad = torch.ones_like(parameter)
    built.step()
    for name, tensor in module.named_parameters():
        rate = 0.5 if name.startswith("2.") else 0.1
        assert torch.equal(tensor.detach(), before[name] - rate), name


def test_without_groups_a_model_or_its_parameters_build_the_same_optimizer():
    options = {"name": "adam", "lr": 0.01}
    module = model()
    by_module, by_tensors = make_optimizer(options, module), make_optimizer(options, module.parameters())
    assert by_module.state_dict() == by_tensors.state_dict()


def train(module: nn.Module, built: torch.optim.Optimizer, steps: int) -> None:
    generator = torch.Generator().manual_seed(steps)
    for _ in range(steps):
        built.zero_grad()
        module(torch.randn(5, 3, generator=generator)).square().mean().backward()
        built.step()


def test_the_state_of_a_grouped_optimizer_loads_into_one_built_again():
    options = {"name": "adam", "lr": 0.01, "param_groups": [{"params": "bias$", "lr": 0.05, "weight_decay": 0.0},
                                                             {"params": "^0\\.", "betas": [0.8, 0.9]}]}
    whole = model()
    whole_optimizer = make_optimizer(options, whole)
    train(whole, whole_optimizer, 3)
    saved_weights, saved_state = copy.deepcopy((whole.state_dict(), whole_optimizer.state_dict()))
    train(whole, whole_optimizer, 4)

    resumed = model()
    resumed.load_state_dict(saved_weights)
    resumed_optimizer = make_optimizer(options, resumed)
    load_optimizer(resumed_optimizer, saved_state)  # as a resume restores it
    train(resumed, resumed_optimizer, 4)
    for (name, mine), theirs in zip(resumed.state_dict().items(), whole.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs), name


@pytest.mark.parametrize(("groups", "message"), [
    ({"params": "bias"}, "train.optimizer.param_groups: expected a list of tables"),
    (["bias"], "train.optimizer.param_groups: expected a list of tables"),
    ([{"lr": 0.1}], "train.optimizer.param_groups[0].params: required: a regular expression"),
    ([{"params": 3}], "train.optimizer.param_groups[0].params: required: a regular expression"),
    ([{"params": "bias"}, {"params": "(weight"}], "train.optimizer.param_groups[1].params: '(weight' is not a "
                                                  "regular expression"),
    ([{"params": "bias"}, {"params": "^head\\."}], "train.optimizer.param_groups[1].params: '^head\\\\.' matches none "
                                                   "of the model's parameters (0.weight, 0.bias, 2.weight, 2.bias)"),
    ([{"params": "bias"}, {"params": "^2\\.bias"}], "train.optimizer.param_groups[1].params: every parameter "
                                                    "'^2\\\\.bias' matches (2.bias) is in an earlier group"),
    ([{"params": "bias"}, {"params": "weight", "lr": "fast"}], "train.optimizer.param_groups[1].lr: expected a number"),
    ([{"params": "bias", "betas": [0.9, 0.99]}], "train.optimizer.param_groups[0].betas: not an argument of "
                                                 "torch.optim.SGD"),
    ([{"params": "bias", "nesterov": 1}], "train.optimizer.param_groups[0].nesterov: expected true or false"),
    ([{"params": "bias", "lr": -1.0}], "train.optimizer.param_groups[0]: Invalid learning rate: -1.0"),
])
def test_a_bad_group_is_one_line_naming_its_key(groups, message):
    with pytest.raises(ConfigError) as raised:
        check_optimizer({"name": "sgd", "lr": 0.1, "param_groups": groups}, model())
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_groups_need_the_model_not_a_list_of_its_parameters():
    with pytest.raises(ConfigError, match=re.escape("train.optimizer.param_groups: picks parameters by name")):
        make_optimizer({"name": "sgd", "lr": 0.1, "param_groups": [{"params": "bias"}]}, model().parameters())


# ---------------------------------------------------------------- in a job: checked before any worker, resumed

GROUPS = {"name": "sgd", "lr": 0.05, "momentum": 0.9,
          "param_groups": [{"params": "^0\\.", "lr": 0.1}, {"params": "bias$", "weight_decay": 0.0}]}


def test_the_launchers_check_refuses_a_group_matching_no_parameter(tmp_path):
    bad = {**GROUPS, "param_groups": [{"params": "^classifier\\."}]}
    with pytest.raises(ConfigError, match=re.escape("train.optimizer.param_groups[0].params: '^classifier\\\\.' "
                                                    "matches none of the model's parameters (0.weight, 0.bias")):
        prepare(job(tmp_path, optimizer=bad))


def test_a_job_with_groups_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir()
    parts.mkdir()
    Runner(job(tmp_path, optimizer=GROUPS), DistInfo(), whole, threads=1, comm=Communicator(0, 1)).run()
    Runner(job(tmp_path, optimizer=GROUPS, epochs=2), DistInfo(), parts, threads=1, comm=Communicator(0, 1)).run()
    resumed = Runner(job(tmp_path, optimizer=GROUPS), DistInfo(), parts, threads=1, resume=True,
                     comm=Communicator(0, 1))
    resumed.run()
    assert [group["lr"] for group in resumed.optimizer.param_groups] == [0.1, 0.05, 0.05]
    for name, tensor in weights(whole).items():
        assert torch.equal(tensor, weights(parts)[name]), name
