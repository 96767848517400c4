"""What every algorithm is: options, one validation entry point, hooks around the loop, state.

Two families build on this: collective algorithms (`collective.py`: every rank trains and they
meet in collectives) and parameter-server algorithms (`server.py`: ranks have roles). The runner
and the training loop call only the hooks below, whatever the family (those only a server needs,
`setup`'s `on_update` and `shares_changed`, do nothing here), so a new algorithm never changes
them: it overrides the hooks it needs (an override of `setup` takes `on_update` and passes it on).
A resume on another number of workers gives every rank rank 0's state, and `reshard_` makes it
that rank's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from shoal.algorithms.groups import contiguous_groups
from shoal.cluster.collectives import Communicator, FlatBuffer
from shoal.errors import ConfigError


@dataclass
class NoOptions:
    """An algorithm without options of its own."""


class Algorithm:
    """How workers combine their work. Subclasses override the hooks they need."""

    name: ClassVar[str] = ""
    """The user-facing `algorithm.name` this class is registered under."""
    variant: ClassVar[dict] = {}
    """Option values that choose this class among those registered under the same name."""
    Options: ClassVar[type] = NoOptions
    supports_groups: ClassVar[bool] = False
    """Whether cluster.groups > 1 means something to this algorithm."""
    counts_nominal_steps: ClassVar[bool] = True
    """Where workers run their own step counts (speed shares): whether `after_step` is told the steps of the
    nominal clock, each of which every worker completes once (a collective algorithm's rounds, which every
    worker enters), rather than this worker's own (a parameter server's trainer exchanges on its own count)."""

    def __init__(self, options=None, groups: int | list[list[int]] = 1):
        """`groups`: cluster.groups as a count, or the members of each group (ranks, one group per machine)."""
        self.options = options if options is not None else self.Options()
        self.members = groups if isinstance(groups, list) else None
        self.groups = len(groups) if isinstance(groups, list) else groups  # how many
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.comm: Communicator | None = None
        self.weigh_by_rows = False
        """Shares differ (cluster.balance): averages weigh each worker by the rows it trained on."""
        self.machines: list[list[int]] | None = None
        """The ranks of each machine, set by the runner before `setup` (synchronous SGD sums within one first)."""
        self.seed = 0
        """The job's seed, set by the runner before `setup`."""

    def same_steps(self) -> bool:
        """Whether every training worker must run the same steps in an epoch (a worker given more rows then
        takes larger batches); otherwise it takes more steps of the job's batch size."""
        return True

    def group_layout(self, count: int) -> list[list[int]]:
        """The members of each group among `count` workers: as given, or contiguous of nearly equal sizes."""
        return self.members if self.members is not None else contiguous_groups(count, self.groups)

    @classmethod
    def summary(cls) -> str:
        """The first line of the class docstring: what `shoal algorithms` and the docs show."""
        return (cls.__doc__ or "").strip().splitlines()[0].rstrip(".")

    def title(self) -> str:
        """How messages name this algorithm."""
        return f"'{self.name}'"

    def check(self, world_size: int) -> None:
        """Raise ConfigError for settings that do not fit `world_size` processes (called once, before setup)."""
        if self.groups > 1 and not self.supports_groups:
            raise ConfigError(f"cluster.groups: {self.title()} has no groups; set cluster.groups = 1, or choose "
                              "an algorithm with groups (`shoal algorithms` lists them)")

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator,
              on_update: Callable[[int], None] | None = None) -> None:
        """Bind to the model, optimizer and communicator; start every rank from rank 0's weights. `on_update`:
        called with the version after every update a server applies (an algorithm without one applies none)."""
        self.model, self.optimizer, self.comm = model, optimizer, comm
        flat = FlatBuffer(model_state(model))
        comm.broadcast_(flat.pack(), source=0)
        flat.unpack_()

    def shares_changed(self, steps_by_trainer: dict[int, int]) -> None:
        """Told each training rank's steps an epoch (by rank): after `setup`, and again at an epoch's start
        whenever the shares moved (cluster.balance). A server serves until every update they send has come;
        a collective algorithm counts its rounds on the nominal clock and need not know."""

    def before_backward(self, weight: float, rows: int, final: bool) -> None:
        """Called before loss.backward(): `weight` turns the gradients it leaves into a rows-weighted sum (the
        batch's rows for a mean loss, 1 for accumulated sums), `rows` are the rows the update will speak for, and
        `final` says whether the update follows this backward pass (the last batch of an accumulated group)."""

    def after_backward(self, rows: int) -> None:
        """Called after loss.backward() on a batch of `rows` rows, before the optimizer's step."""

    def after_step(self, step: int) -> None:
        """Called after the update of global step `step` (counted from 1 across epochs). Where workers run their
        own step counts (shares sized by speed) and `counts_nominal_steps`, the steps are those of the nominal
        clock: a batch may complete none, one or several, and every worker completes each once."""

    def end_epoch(self, epoch: int) -> None:
        """Called on a trainer when it has finished epoch `epoch` (from 0)."""

    def consensus(self) -> contextlib.AbstractContextManager[nn.Module]:
        """The model to evaluate and save: by default this rank's replica as it stands."""
        return contextlib.nullcontext(self.model)

    def holds_consensus(self) -> bool:
        """Whether `consensus()` can lend the consensus now, on this rank alone (a validation between
        exchanges asks; the epoch's evaluation and the save come after the epoch's exchange)."""
        return True

    def epoch_report(self) -> dict:
        """What this rank's algorithm has to say about the epoch just ended, for `epoch_end`."""
        return {}

    def state_dict(self) -> dict:
        """The algorithm's own state, for checkpoints."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned."""

    def close(self) -> None:
        """Release what `setup` started (hooks, threads); called once training on this rank is over."""

    def reshard_(self) -> None:
        """Called on every rank once it has loaded rank 0's state of a checkpoint (a resume on another number
        of workers, see `shoal.train.reshard`): make that state this rank's. By default rank 0's replica,
        optimizer and algorithm state stand for every worker's: a collective algorithm ends every epoch with
        its replicas equal (synchronous SGD never lets them differ; averaging's closing round)."""


def model_state(model: nn.Module) -> list[torch.Tensor]:
    """Parameters and floating-point buffers (batch-norm statistics): what replicas must share."""
    tensors = [p.data for p in model.parameters()]
    tensors += [b for b in model.buffers() if b.is_floating_point()]
    return tensors
