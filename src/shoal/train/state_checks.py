"""What a loaded rank file must hold before anything of it is applied to the model, optimizer or generators.

A rank file can load and still hold what crashes every restart from its checkpoint at the first step
(an optimizer moment of another shape, a random-generator record torch or NumPy refuses), or what
trains on from non-finite weights. `TrainingState.fits` runs these checks on every candidate file
before a checkpoint is chosen, and on the chosen one again before it is applied, so such a file is
passed over like a damaged one. Each check returns "" or one line saying what is wrong:

- the optimizer: as many parameter groups, of as many parameters, as the job's optimizer has; the
  state of known parameters only; each of its tensors a scalar (a step count) or of its parameter's
  dtype and shape (a factored moment, Adafactor's, may have 1 where the parameter has more);
- the algorithm's state: each tensor the algorithm holds now of the same shape and dtype in the file;
- the random generators: the CPU generator's state a torch.ByteTensor of its size that torch takes,
  NumPy's a legacy MT19937 state (624 32-bit keys, a position up to 624), Python's 625 32-bit words
  (the last a position up to 624) and a float or None, CUDA's (on a GPU) a ByteTensor of its size;
- finiteness, unless `checkpoint.allow_nonfinite`: the model's parameters (not its buffers, which may
  hold an infinite mask by design), the optimizer's state and the numbers of its groups' settings (a
  schedule's learning rate is taken from them), and the algorithm's floating tensors.

The model's weights themselves (names, shapes, dtypes) are `state.model_misfit`'s.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch

from shoal.finite import nonfinite

MT_KEYS = 624
"""The 32-bit words of a Mersenne Twister's state (NumPy's legacy generator, Python's random)."""
WORD = 2**32


def optimizer_misfit(optimizer: torch.optim.Optimizer, names: dict[int, str], stored, finite: bool) -> str:
    """Why a stored optimizer state cannot be applied to `optimizer` ("" when it can). `names`: each parameter's
    name by its id(), for the message."""
    if not (isinstance(stored, dict) and isinstance(stored.get("state"), dict)
            and isinstance(stored.get("param_groups"), list)):
        return "no optimizer state in it"
    groups = stored["param_groups"]
    sizes = [len(group["params"]) for group in optimizer.param_groups]
    saved = [len(group["params"]) if isinstance(group, dict) and isinstance(group.get("params"), list) else None
             for group in groups]
    if saved != sizes:
        return f"its optimizer's parameter groups do not fit the optimizer ({saved} parameters in the file, {sizes})"
    if finite and (problem := settings_misfit(groups)):
        return problem
    parameters = {index: parameter for group, current in zip(groups, optimizer.param_groups, strict=True)
                  for index, parameter in zip(group["params"], current["params"], strict=True)}
    for index, entry in stored["state"].items():
        if index not in parameters or not isinstance(entry, dict):
            return f"its optimizer holds state of no parameter of the optimizer ({index!r})"
        parameter = parameters[index]
        for key, value in entry.items():
            where = f"the optimizer's {key!r} of {names.get(id(parameter), f'parameter {index}')!r}"
            if isinstance(value, torch.Tensor) and (problem := moment_misfit(where, value, parameter, finite)):
                return problem
    return ""


def settings_misfit(groups: list[dict]) -> str:
    """Every number in the stored groups' settings finite (a schedule's learning rate is taken from them)."""
    for position, group in enumerate(groups):
        for key, value in group.items():
            values = value if isinstance(value, (list, tuple)) and key != "params" else [value]
            if any(isinstance(number, float) and not math.isfinite(number) for number in values):
                return f"its optimizer's {key!r} of parameter group {position} is not finite ({value!r})"
    return ""


def moment_misfit(where: str, value: torch.Tensor, parameter: torch.Tensor, finite: bool) -> str:
    """A tensor of an optimizer's state: a scalar, or of its parameter's dtype and (factored) shape; finite."""
    if value.dim() > 0:
        shape, wanted = list(value.shape), list(parameter.shape)
        if len(shape) != len(wanted) or any(size not in (1, full) for size, full in zip(shape, wanted)):
            return f"{where}: {shape} in the file, the parameter is {wanted}"
        if value.dtype != parameter.dtype:
            return f"{where}: {value.dtype} in the file, the parameter is {parameter.dtype}"
    elif value.is_complex() and not parameter.is_complex():
        return f"{where}: {value.dtype} in the file"
    return nonfinite(where, value) if finite else ""


def tensors_misfit(where: str, wanted, stored, finite: bool) -> str:
    """Nested state (the algorithm's): each tensor both hold of the same shape and dtype; floating ones finite."""
    if isinstance(stored, torch.Tensor):
        if isinstance(wanted, torch.Tensor) and (stored.shape != wanted.shape or stored.dtype != wanted.dtype):
            return (f"{where}: {list(stored.shape)} {stored.dtype} in the file, "
                    f"{list(wanted.shape)} {wanted.dtype} now")
        return nonfinite(where, stored) if finite else ""
    if isinstance(stored, dict):
        wanted = wanted if isinstance(wanted, dict) else {}
        return next(filter(None, (tensors_misfit(f"{where}[{key!r}]", wanted.get(key), value, finite)
                                  for key, value in stored.items())), "")
    if isinstance(stored, (list, tuple)):
        return next(filter(None, (tensors_misfit(f"{where}[{index}]", None, value, finite)
                                  for index, value in enumerate(stored))), "")
    return ""


def random_misfit(state, device: torch.device) -> str:
    """Why a stored random-generator record cannot be restored ("" when it can): each generator's state is
    checked as it must be, then handed to a new generator of that kind."""
    if not isinstance(state, dict) or not isinstance(state.get("torch"), torch.Tensor):
        return "no random-generator states in it"
    problem = byte_state_misfit("torch's CPU generator state", state["torch"], torch.get_rng_state())
    if not problem:
        try:
            torch.Generator().set_state(state["torch"])
        except (RuntimeError, TypeError, ValueError) as error:
            problem = f"torch's CPU generator state is refused ({error})"
    if not problem and "numpy" in state:
        problem = numpy_misfit(state["numpy"])
    if not problem and "python" in state:
        problem = python_misfit(state["python"])
    if not problem and "cuda" in state and device.type == "cuda":
        problem = byte_state_misfit("CUDA's generator state", state["cuda"], torch.cuda.get_rng_state(device))
    return f"its random-generator record: {problem}" if problem else ""


def byte_state_misfit(what: str, stored, current: torch.Tensor) -> str:
    if not isinstance(stored, torch.Tensor) or stored.dtype != torch.uint8 or stored.shape != current.shape:
        found = f"{stored.dtype} {list(stored.shape)}" if isinstance(stored, torch.Tensor) else type(stored).__name__
        return f"{what} is {found}, not a torch.ByteTensor of {current.numel()} bytes"
    return ""


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def numpy_misfit(state) -> str:
    """NumPy's legacy generator: MT19937, 624 keys below 2**32 (cast to uint32 on restore, so checked first)."""
    keys = state.get("keys") if isinstance(state, dict) else None
    if not (isinstance(keys, torch.Tensor) and keys.shape == (MT_KEYS,) and not keys.is_floating_point()
            and state.get("kind") == "MT19937" and is_int(state.get("position"))
            and 0 <= state["position"] <= MT_KEYS and state.get("has_gauss") in (0, 1)
            and isinstance(state.get("cached"), (int, float))):
        return "NumPy's generator state is not a legacy MT19937 state (624 keys, a position up to 624)"
    if bool(((keys < 0) | (keys >= WORD)).any()):
        return "NumPy's generator state holds keys that are not 32-bit words"
    try:
        np.random.RandomState().set_state((state["kind"], keys.numpy().astype(np.uint32), state["position"],
                                           state["has_gauss"], state["cached"]))
    except (TypeError, ValueError) as error:
        return f"NumPy's generator state is refused ({error})"
    return ""


def python_misfit(state) -> str:
    """Python's random: a version, 624 32-bit words and a position up to 624, a cached gauss (float or None)."""
    internal = state.get("internal") if isinstance(state, dict) else None
    if not (isinstance(internal, (list, tuple)) and len(internal) == MT_KEYS + 1 and all(map(is_int, internal))
            and all(0 <= word < WORD for word in internal[:MT_KEYS]) and 0 <= internal[MT_KEYS] <= MT_KEYS
            and is_int(state.get("version")) and (state.get("gauss") is None or isinstance(state["gauss"], float))):
        return "Python's generator state is not 624 32-bit words, a position up to 624 and a float or None"
    try:
        random.Random().setstate((state["version"], tuple(internal), state["gauss"]))
    except (TypeError, ValueError) as error:
        return f"Python's generator state is refused ({error})"
    return ""
