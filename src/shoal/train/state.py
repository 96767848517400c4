"""One rank's training state, whose `state_dict` is the checkpoint schema.

Everything a rank needs to continue exactly where it stopped: the model, the optimizer, the
algorithm's own state, the step counter of its role, the random generators and, with shares sized by
speed, the next epoch's shares and the rates behind them. The keys of a
rank's checkpoint file are written and read here and nowhere else; the checkpoint folder's
layout and its coordinator file belong to `checkpoint`. The optimizer's state is restored under
the job's current settings, so `--set train.optimizer.lr=...` on resume takes effect, except those a
learning-rate scheduler sets as it goes, which continue where the schedule was. `fits` tells a
rank file that cannot be applied (weights of another shape or dtype, or not finite, an optimizer state or
random-generator record that does not fit: see `state_checks`), so resuming passes over it before any of it
is applied.
`load_resharded` takes rank 0's state as this rank's, on a resume on another number of workers
(see `reshard`): what rank 0 holds but the shares sized by speed, which a fresh job plans again,
and then the algorithm makes it this rank's own.
"""

from __future__ import annotations

from typing import Protocol

import torch

from shoal.algorithms import Algorithm
from shoal.finite import nonfinite_parameters
from shoal.train.balancer import Balancer
from shoal.train.checkpoint import random_state, restore_random_state
from shoal.train.schedule import Schedule
from shoal.train.state_checks import optimizer_misfit, random_misfit, tensors_misfit

SCHEMA = ("model", "optimizer", "algorithm", "global_step", "random")
"""The keys every rank file holds (`state_dict`); "schedule" and "balance" only with a schedule or balancer."""
SCHEDULED = ("lr", "initial_lr", "momentum", "betas", "max_lr", "min_lr", "base_momentum", "max_momentum")
"""Optimizer settings a learning-rate scheduler changes as it goes (OneCycleLR and CyclicLR cycle momentum)."""


class Counter(Protocol):
    """What owns the step count: a trainer, or a serving rank."""

    global_step: int


class TrainingState:
    """Model, optimizer, algorithm, step counter and random generators of one rank (torchtitan's Stateful)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, algorithm: Algorithm,
                 counter: Counter, device: torch.device, schedule: Schedule | None = None,
                 balancer: Balancer | None = None, allow_nonfinite: bool = False):
        """`allow_nonfinite`: checkpoint.allow_nonfinite, a rank file with non-finite weights or optimizer state
        may be applied."""
        self.model, self.optimizer, self.algorithm = model, optimizer, algorithm
        self.counter, self.device, self.schedule, self.balancer = counter, device, schedule, balancer
        self.allow_nonfinite = allow_nonfinite

    def state_dict(self) -> dict:
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "algorithm": self.algorithm.state_dict(), "global_step": self.counter.global_step,
                 "random": random_state(self.device)}
        if self.schedule is not None:
            state["schedule"] = self.schedule.state_dict()
        if self.balancer is not None:
            state["balance"] = self.balancer.state_dict()  # the next epoch's shares and the rates behind them
        return state

    def fits(self, state: dict) -> str:
        """"" when a loaded rank file can be applied to this rank (`load_state_dict`), else the first thing that
        does not fit: a key of the schema missing, weights that differ from the model's in name, shape or dtype,
        or an optimizer state, algorithm state or random-generator record that does not fit (`state_checks`);
        non-finite weights or optimizer state unless `allow_nonfinite`."""
        if not isinstance(state, dict):
            return "not a rank's state"
        missing = next((key for key in SCHEMA if key not in state), None)
        if missing is not None:
            return f"its {missing!r} is missing"
        finite = not self.allow_nonfinite
        step = state["global_step"]
        names = [name for name, _ in self.model.named_parameters(remove_duplicate=False)]
        by_id = {id(parameter): name for name, parameter in self.model.named_parameters()}
        return (model_misfit(self.model.state_dict(), state["model"])
                or (nonfinite_parameters(names, state["model"]) if finite else "")
                or optimizer_misfit(self.optimizer, by_id, state["optimizer"], finite)
                or tensors_misfit("the algorithm's state", self.algorithm.state_dict(), state["algorithm"], finite)
                or random_misfit(state["random"], self.device)
                or ("" if isinstance(step, int) and not isinstance(step, bool) and step >= 0
                    else f"its global step is {step!r}"))

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        load_optimizer(self.optimizer, state["optimizer"])
        if self.schedule is not None and "schedule" in state:
            self.schedule.load_state_dict(state["schedule"])
            # what the schedule had set (a cycled momentum too) is what training goes on with
            for group, saved in zip(self.optimizer.param_groups, state["optimizer"]["param_groups"], strict=True):
                group.update({key: saved[key] for key in SCHEDULED if key in saved})
        self.algorithm.load_state_dict(state["algorithm"])
        self.counter.global_step = state["global_step"]
        if self.balancer is not None:
            self.balancer.load_state_dict(state.get("balance"))
        restore_random_state(state["random"], self.device)

    def load_resharded(self, state: dict) -> None:
        """Rank 0's `state` as this rank's, for a job on another number of workers: its model, optimizer,
        schedule, algorithm state and step count, then the algorithm's `reshard_` (a trainer of a parameter
        server takes a fresh optimizer, an EASGD replica the centre). The shares and rates sized by speed are
        left out: the next epoch is planned as a fresh job's. The random generators are rank 0's until the
        caller seeds them (`reshard.reseed`)."""
        self.load_state_dict({key: value for key, value in state.items() if key != "balance"})
        self.algorithm.reshard_()


def model_misfit(wanted: dict, stored) -> str:
    """Why the weights `stored` cannot be loaded into a model whose state_dict is `wanted` ("" when they can)."""
    if not isinstance(stored, dict):
        return "no model weights in it"
    if stored.keys() != wanted.keys():
        name = sorted(stored.keys() ^ wanted.keys())[0]
        return f"its weights do not fit the model ({name!r} is in {'the file' if name in stored else 'the model'} only)"
    for name, tensor in wanted.items():
        saved = stored[name]
        if not isinstance(saved, torch.Tensor) or saved.shape != tensor.shape:
            shape = list(saved.shape) if isinstance(saved, torch.Tensor) else type(saved).__name__
            return (f"its weights do not fit the model ({name!r}: {shape} in the file, "
                    f"{list(tensor.shape)} in the model)")
        if saved.dtype != tensor.dtype:
            return (f"its weights do not fit the model ({name!r}: {saved.dtype} in the file, "
                    f"{tensor.dtype} in the model)")
    return ""


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Restore an optimizer's state (its moments, step counts) but keep the settings it was built with.

    torch's `load_state_dict` also brings back each param group's lr, betas, weight decay, momentum,
    eps...: a job resumed with another `train.optimizer.lr` would train on with the old one while its
    job.toml says the new. The optimizer is built from the job's current `train.optimizer`, so its
    groups hold exactly those settings (and torch's defaults for the keys the job leaves out)."""
    settings = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, current in zip(optimizer.param_groups, settings, strict=True):
        group.update(current)
