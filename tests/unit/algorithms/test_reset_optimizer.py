"""algorithm.reset_optimizer: averaging starts the optimizer afresh after every round (Kennedy et al.).

Right after a round (across all workers, within a group, at an epoch's end) the optimizer holds no
per-parameter state, its learning rates as they were, so the steps that follow are those of an
optimizer just built on the averaged weights; without the option its moments carry on. Ranks are
threads of the fake communicator: no processes.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from shoal.algorithms import make_algorithm
from shoal.algorithms.averaging import AveragingOptions, ModelAveraging
from shoal.cluster.fake import run_ranks
from shoal.errors import ConfigError
from shoal.jobs import from_dict
from shoal.train.prepare import make_optimizer

SEEDING = threading.Lock()  # ranks are threads: model construction seeds the global generator
OPTIMIZERS = {
    "sgd": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
    "adam": {"name": "adam", "lr": 0.01, "param_groups": [{"params": "bias$", "lr": 0.05}]},
}


def model() -> nn.Module:
    with SEEDING:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def train_step(module: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """One step on a batch drawn from `seed`: the same batch for every optimizer given the same seed."""
    generator = torch.Generator().manual_seed(seed)
    optimizer.zero_grad()
    module(torch.randn(6, 3, generator=generator)).square().mean().backward()
    optimizer.step()


def steps_to_a_round(comm, options: dict, reset: bool, compression: str = "none"):
    """Two steps (each rank on its own batches), then the round of period 2; the optimizer right after."""
    module = model()
    optimizer = make_optimizer(options, module)
    algorithm = ModelAveraging(AveragingOptions(period=2, reset_optimizer=reset, compression=compression))
    algorithm.setup(module, optimizer, comm)
    for step in (1, 2):
        train_step(module, optimizer, seed=10 * step + comm.rank)
        algorithm.after_backward(6)
        algorithm.after_step(step)
    return module, optimizer, algorithm


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("world_size, compression", [(1, "none"), (2, "none"), (2, "bf16")])
def test_after_a_round_the_optimizer_is_a_fresh_one_of_the_same_rates(name, world_size, compression):
    def rank(comm):
        module, optimizer, _ = steps_to_a_round(comm, OPTIMIZERS[name], reset=True, compression=compression)
        emptied = len(optimizer.state) == 0
        rates = [group["lr"] for group in optimizer.param_groups]
        fresh_model = copy.deepcopy(module)  # the averaged weights
        fresh = make_optimizer(OPTIMIZERS[name], fresh_model)
        for seed in (30, 31):  # the steps before the next round
            train_step(module, optimizer, seed)
            train_step(fresh_model, fresh, seed)
        same = all(torch.equal(mine, theirs) for mine, theirs in zip(module.parameters(), fresh_model.parameters(),
                                                                      strict=True))
        return emptied, rates, same

    expected_rates = [0.05, 0.01] if name == "adam" else [0.1]
    for emptied, rates, same in run_ranks(world_size, rank):
        assert emptied
        assert rates == expected_rates
        assert same


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_without_it_the_optimizers_state_carries_over_the_round(name):
    def rank(comm):
        module = model()
        optimizer = make_optimizer(OPTIMIZERS[name], module)
        algorithm = ModelAveraging(AveragingOptions(period=2))
        algorithm.setup(module, optimizer, comm)
        train_step(module, optimizer, seed=comm.rank)
        algorithm.after_step(1)
        train_step(module, optimizer, seed=5 + comm.rank)
        before = copy.deepcopy(optimizer.state_dict()["state"])
        algorithm.after_step(2)
        after = optimizer.state_dict()["state"]
        return before.keys() == after.keys() and all(
            torch.equal(before[key][field], after[key][field]) for key in before for field in before[key])

    assert all(run_ranks(2, rank))


def test_group_rounds_and_the_epochs_closing_round_reset_it_too():
    def rank(comm):
        module = model()
        optimizer = make_optimizer(OPTIMIZERS["sgd"], module)
        algorithm = ModelAveraging(AveragingOptions(period=4, group_period=2, reset_optimizer=True), groups=2)
        algorithm.setup(module, optimizer, comm)
        emptied = []
        for step in (1, 2, 3):
            train_step(module, optimizer, seed=10 * step + comm.rank)
            algorithm.after_step(step)
            emptied.append(len(optimizer.state) == 0)
        train_step(module, optimizer, seed=40 + comm.rank)
        algorithm.end_epoch(0)  # the epoch ends between rounds: its closing round across all workers
        emptied.append(len(optimizer.state) == 0)
        return emptied

    for emptied in run_ranks(4, rank):
        assert emptied == [False, True, False, True]  # the group round at step 2, the closing round


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_the_option_is_true_or_false(value):
    with pytest.raises(ConfigError) as raised:
        make_algorithm("averaging", {"reset_optimizer": value})
    assert str(raised.value) == f"algorithm.reset_optimizer: must be true or false, got {value!r}"


def test_a_job_file_sets_it_for_averaging(tmp_path):
    def options(algorithm: dict) -> dict:
        return from_dict({"model": {"layers": [{"dense": 2}]}, "data": {"train": str(tmp_path)},
                          "algorithm": algorithm}, name="job").algorithm.options

    assert options({"name": "averaging"})["reset_optimizer"] is False
    assert options({"name": "averaging", "reset_optimizer": True})["reset_optimizer"] is True
    assert "reset_optimizer" not in options({"name": "sync", "reset_optimizer": True})  # averaging's key, set aside
    with pytest.raises(ConfigError, match="^algorithm.reset_optimizer: expected bool, got 'on'$"):
        options({"name": "averaging", "reset_optimizer": "on"})
