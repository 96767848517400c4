"""The user's per-batch transform (random augmentation), with draws that a resumed job repeats.

`data.transform` names a function `batch -> batch` that each training worker applies to every batch
of every epoch, as users of other frameworks augment in their DataLoader. Its random draws must be
reproducible and must not disturb the job's own: a job resumed from a checkpoint in the middle of a
run has to see the same augmentations to end with the same weights, and the model's dropout draws
must be those it would have drawn without a transform. So each call runs with torch's CPU generator
(and the CUDA generator of every device the batch is on), NumPy's global generator and Python's
`random` seeded from (seed, trainer, epoch, step) alone, and puts all of them back afterwards.

That costs about 0.2 ms a batch on a 2-core machine, most of it NumPy's `get_state`/`set_state`
(documented calls, kept for that rather than copying its generator's memory): small beside a
training step of a model worth augmenting data for.

A transform may reshape the inputs (a crop) where the model takes the new shape. Where the model
refuses them on the first batch and takes the data's own shape, the job stops in one line naming the
transform and both shapes (`misshapen`), not torch's traceback from inside the model; so it does for
a step that feeds the model another shape.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shoal.code import load_code
from shoal.errors import ConfigError, UserCodeError, blamed
from shoal.train.step import KEY as STEP_KEY

KEY = "data.transform"
DOMAIN = b"shoal.transform"  # keeps these seeds apart from the job's other seeded draws
SEED_MASK = 2**63 - 1

Batch = tuple[torch.Tensor, torch.Tensor] | dict[str, Any]


def step_seeds(seed: int, trainer: int, epoch: int, step_in_epoch: int) -> tuple[int, int, int]:
    """Seeds for torch (63 bits), NumPy (32 bits) and Python's `random` (63 bits).

    One hash of (seed, trainer, epoch, step), a different part of it for each, so that no two of them
    repeat each other's numbers (NumPy's and Python's Mersenne Twisters would, given one key). NumPy's
    global generator is seeded from 32 bits, as torch's CPU generator takes 32 of its seed's bits:
    seeding it from an array of words costs five times as much.
    """
    digest = hashlib.blake2b(struct.pack("<4Q", seed, trainer, epoch, step_in_epoch), digest_size=20,
                             person=DOMAIN).digest()
    torch_seed, numpy_seed, python_seed = struct.unpack("<QIQ", digest)
    return torch_seed & SEED_MASK, numpy_seed, python_seed & SEED_MASK


def load_transform(reference: str | None, run_dir) -> Callable[[Batch], Batch] | None:
    """The job's `data.transform` function (None without one): imported, or read from the run directory."""
    return None if reference is None else checked_function(load_code(reference, KEY, run_dir))


def checked_function(function: Any) -> Callable[[Batch], Batch]:
    if not callable(function):
        raise ConfigError(f"{KEY}: expected a function taking a batch, got {type(function).__name__}")
    return function


class Transform:
    """`function(batch) -> batch` run with generators seeded from (seed, trainer, epoch, step), then restored.

    `trainer` is the worker's index among the training workers. Called as
    `transform(batch, epoch, step_in_epoch)`; the result keeps the batch's structure and rows.
    """

    def __init__(self, function: Callable[[Batch], Batch], seed: int, trainer: int):
        self.function, self.seed, self.trainer = checked_function(function), int(seed), int(trainer)

    def __call__(self, batch: Batch, epoch: int, step_in_epoch: int) -> Batch:
        torch_seed, numpy_seed, python_seed = step_seeds(self.seed, self.trainer, epoch, step_in_epoch)
        generators = [torch.cuda.default_generators[index] for index in cuda_devices(batch)]
        saved = ([generator.get_state() for generator in generators], torch.default_generator.get_state(),
                 np.random.get_state(), random.getstate())
        try:
            for generator in generators:
                generator.manual_seed(torch_seed)
            torch.default_generator.manual_seed(torch_seed)
            np.random.seed(numpy_seed)
            random.seed(python_seed)
            with blamed(KEY):
                result = self.function(batch)
        finally:
            for generator, state in zip(generators, saved[0], strict=True):
                generator.set_state(state)
            torch.default_generator.set_state(saved[1])
            np.random.set_state(saved[2])
            random.setstate(saved[3])
        return checked(batch, result)


def cuda_devices(batch: Batch) -> list[int]:
    """The indices of the CUDA devices the batch's tensors are on (none for a batch on the CPU)."""
    values = batch.values() if isinstance(batch, dict) else batch
    return sorted({value.device.index for value in values if isinstance(value, torch.Tensor) and value.is_cuda})


def rows_of(value: Any) -> int | None:
    """A tensor's rows (its first dimension); None for anything else, or a tensor without one."""
    return value.shape[0] if isinstance(value, torch.Tensor) and value.dim() > 0 else None


def described(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))}"
    return "None" if value is None else f"a {type(value).__name__}"


def checked(batch: Batch, result: Any) -> Batch:
    """The transform's result, when it keeps the batch's structure: (inputs, labels) as two tensors of the
    batch's rows, or a dict with the batch's keys and the same rows in each of its tensors; else a
    `ConfigError` saying what came back."""
    if isinstance(batch, dict):
        return _checked_dict(batch, result)
    rows = rows_of(batch[0])
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise ConfigError(f"{KEY}: returned {described(result)}; expected (inputs, labels), two tensors of "
                          f"the batch's {rows} rows")
    for name, value in zip(("inputs", "labels"), result, strict=True):
        if rows_of(value) != rows:
            raise ConfigError(f"{KEY}: returned {described(value)} as its {name}; expected a tensor of the "
                              f"batch's {rows} rows")
    return result if isinstance(result, tuple) else tuple(result)


def _checked_dict(batch: dict[str, Any], result: Any) -> dict[str, Any]:
    if not isinstance(result, dict) or result.keys() != batch.keys():
        raise ConfigError(f"{KEY}: returned {described(result)}; expected a dict with the batch's keys "
                          f"{sorted(map(str, batch))}")
    for key, value in batch.items():
        rows = rows_of(value)
        if rows is not None and rows_of(result[key]) != rows:
            raise ConfigError(f"{KEY}: returned {described(result[key])} under {key!r}; expected a tensor of "
                              f"the batch's {rows} rows")
    return result


class ModelInputs:
    """Once attached and while entered, the positional arguments of each call of the model that has not returned:
    after a failure, those of the call that raised (`refused`). Hooks on the model for one batch, taken off on
    leaving."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.open, self.hooks = model, [], []

    def attach(self) -> bool:
        """Put the hooks on the model; False where it takes none (a TorchScript module), nothing left on it."""
        try:
            self.hooks.append(self.model.register_forward_pre_hook(self.called))
            self.hooks.append(self.model.register_forward_hook(self.returned))
        except RuntimeError:
            self.__exit__()
            return False
        return True

    def __enter__(self) -> ModelInputs:  # attached already
        return self

    def __exit__(self, *exception) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def called(self, module, arguments) -> None:  # returning None leaves the arguments as they are
        self.open.append(arguments)

    def returned(self, module, arguments, outputs) -> None:  # and the outputs
        self.open.pop()

    @property
    def refused(self) -> torch.Tensor | None:
        """The first argument of the call that raised, when it is a tensor."""
        arguments = self.open[-1] if self.open else ()
        return arguments[0] if arguments and isinstance(arguments[0], torch.Tensor) else None


def misshapen(model: torch.nn.Module, before: torch.Tensor, transformed: torch.Tensor, given: torch.Tensor | None,
              error: Exception, autocast) -> ConfigError | None:
    """The one line for a model that refused inputs of another sample shape than the data's (`before`: the
    batch's inputs as the data gave them; `transformed`: after the transform; `given`: what the model was called
    with) and takes the data's own: naming the transform that reshaped them, else the step. None where the
    model's failure is not that one (it refuses the data's shape too, or failed otherwise)."""
    cause = error.__cause__ if isinstance(error, UserCodeError) else error
    if (not isinstance(cause, RuntimeError) or isinstance(cause, torch.cuda.OutOfMemoryError) or given is None
            or given.shape[1:] == before.shape[1:] or not takes(model, before, autocast)):
        return None
    if transformed.shape[1:] != before.shape[1:]:
        return ConfigError(f"{KEY}: returned inputs of shape {list(transformed.shape)}; the model takes "
                           f"{list(before.shape)} (the batch's shape before the transform)")
    return ConfigError(f"{STEP_KEY}: gave the model inputs of shape {list(given.shape)}; the model takes "
                       f"{list(before.shape)} (the batch's shape)")


def takes(model: torch.nn.Module, inputs: torch.Tensor, autocast) -> bool:
    """Whether the model's forward runs on `inputs` (a check on the way out of a failed job: its state may move)."""
    try:
        with torch.no_grad(), autocast():
            model(inputs)
    except Exception:  # whatever the model raises, it does not take them
        return False
    return True
