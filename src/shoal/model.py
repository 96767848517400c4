"""Models from a layer list (TOML/JSON data) or from an explicit `package.module:function`.

A spec is plain data: `{"input": [123], "layers": [{"dense": 100, "activation": "relu"}, ...]}`,
`{"input": [...], "factory": "pkg.mod:fn", "arguments": {...}}`, or `{"input": [...], "object": FILE}`
for a model shipped by value (`shoal.fit(model=module)`). The same spec is saved
with the trained weights so `load_model` can rebuild the module. Code is run only through an
explicit factory or a shipped model; a layer list never executes anything. A spec read back from a run directory
is data that anyone may have written: `check_trusted` refuses its factory unless the user vouches
for it.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal.code import current_folder_importable, imported, object_file
from shoal.errors import ConfigError, first_line
from shoal.objects import load_object

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "elu": nn.ELU,
    "silu": nn.SiLU,
    "leaky_relu": nn.LeakyReLU,
    "softmax": lambda: nn.Softmax(dim=-1),
    "log_softmax": lambda: nn.LogSoftmax(dim=-1),
    "linear": nn.Identity,
}


class LastOutput(nn.Module):
    """An LSTM over (sequence, features) input that returns the last time step's output."""

    def __init__(self, features: int, hidden: int, layers: int):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=layers, batch_first=True)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        outputs, _ = self.lstm(inputs)
        return outputs[:, -1]


class Reshape(nn.Module):
    """Reshape each sample (the batch dimension is kept)."""

    def __init__(self, shape: list[int]):
        super().__init__()
        self.shape = tuple(shape)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs.reshape(inputs.shape[0], *self.shape)


def _options(layer: dict, where: str, allowed: set[str]) -> None:
    for key in layer:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{where}: unknown option '{key}'{hint}")


def _positive(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: must be a positive integer, got {value!r}")
    return value


def _check_option_values(layer: dict, where: str) -> None:
    """Option values are checked here so that torch never sees a bad one."""
    for key in ("kernel", "stride", "layers"):
        if key in layer:
            _positive(layer[key], f"{where}.{key}")
    if "padding" in layer and (isinstance(layer["padding"], bool) or not isinstance(layer["padding"], int)
                               or layer["padding"] < 0):
        raise ConfigError(f"{where}.padding: must be an integer >= 0, got {layer['padding']!r}")
    if "bias" in layer and not isinstance(layer["bias"], bool):
        raise ConfigError(f"{where}.bias: must be true or false, got {layer['bias']!r}")
    shape = layer.get("reshape", [1])
    if not isinstance(shape, list) or not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                                                        for s in shape):
        raise ConfigError(f"{where}.reshape: must be a list of positive integers, got {layer['reshape']!r}")


def _activation(name: Any, where: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ConfigError(f"{where}: unknown activation {name!r}; choose one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


def _layer(layer: dict, shape: tuple[int, ...], where: str) -> list[nn.Module]:
    """The modules for one layer entry, given the shape of one input sample."""
    # 'activation' is a layer of its own, or an option of another layer
    kinds = [k for k in LAYER_KINDS if k in layer and k != "activation"] or [k for k in ("activation",) if k in layer]
    if len(kinds) != 1:
        known = ", ".join(LAYER_KINDS)
        keys = ", ".join(layer) or "nothing"
        close = [c for key in layer for c in difflib.get_close_matches(key, list(LAYER_KINDS), n=1)]
        hint = f" (did you mean '{close[0]}'?)" if close and not kinds else ""
        raise ConfigError(f"{where}: each layer needs exactly one kind ({known}); got {keys}{hint}")
    kind = kinds[0]
    _options(layer, where, {kind} | LAYER_KINDS[kind])
    _check_option_values(layer, where)
    value = layer[kind]
    modules: list[nn.Module] = []
    if kind == "dense":
        if len(shape) > 1:
            modules.append(nn.Flatten())
        modules.append(nn.Linear(math.prod(shape), _positive(value, f"{where}.dense"), bias=layer.get("bias", True)))
    elif kind == "dropout":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ConfigError(f"{where}.dropout: must be a probability in [0, 1), got {value!r}")
        modules.append(nn.Dropout(value))
    elif kind == "activation":
        modules.append(_activation(value, f"{where}.activation"))
    elif kind == "conv2d":
        if len(shape) == 2:
            modules.append(Reshape([1, *shape]))  # a grey image: one channel
            shape = (1, *shape)
        if len(shape) != 3:
            raise ConfigError(f"{where}: conv2d needs (channels, height, width) input, got {list(shape)}")
        modules.append(
            nn.Conv2d(
                shape[0],
                _positive(value, f"{where}.conv2d"),
                kernel_size=layer.get("kernel", 3),
                stride=layer.get("stride", 1),
                padding=layer.get("padding", 0),
            )
        )
    elif kind == "maxpool":
        modules.append(nn.MaxPool2d(_positive(value, f"{where}.maxpool"), stride=layer.get("stride")))
    elif kind == "flatten":
        modules.append(nn.Flatten())
    elif kind == "batchnorm":
        modules.append(nn.BatchNorm1d(shape[0]) if len(shape) in (1, 2) else nn.BatchNorm2d(shape[0]))
    elif kind == "lstm":
        if len(shape) != 2:
            raise ConfigError(f"{where}: lstm needs (sequence, features) input, got {list(shape)}")
        modules.append(LastOutput(shape[1], _positive(value, f"{where}.lstm"), layer.get("layers", 1)))
    elif kind == "reshape":
        if not isinstance(value, list) or math.prod(value) != math.prod(shape):
            raise ConfigError(f"{where}.reshape: {value!r} does not hold {math.prod(shape)} values")
        modules.append(Reshape(value))
    if "activation" in layer and kind != "activation":
        modules.append(_activation(layer["activation"], f"{where}.activation"))
    return modules


LAYER_KINDS: dict[str, set[str]] = {
    "dense": {"activation", "bias"},
    "dropout": set(),
    "activation": set(),
    "conv2d": {"kernel", "stride", "padding", "activation"},
    "maxpool": {"stride"},
    "flatten": set(),
    "batchnorm": set(),
    "lstm": {"layers"},
    "reshape": set(),
}


# layers whose output has their input's shape
SHAPE_KEEPING = (nn.Dropout, nn.Identity, nn.ReLU, nn.Sigmoid, nn.Tanh, nn.GELU, nn.ELU, nn.SiLU, nn.LeakyReLU,
                 nn.Softmax, nn.LogSoftmax, nn.BatchNorm1d)


def _known_shape(modules: list[nn.Module], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The output shape of layers that need no forward pass to tell it (dense ones and what keeps a shape), or
    None. On the meta device, where the launcher sizes a model, a forward pass imports torch's decompositions
    and sympy: half a second of every `shoal train`."""
    for module in modules:
        if isinstance(module, nn.Flatten) and module.start_dim == 1 and module.end_dim == -1:
            shape = (math.prod(shape),)
        elif isinstance(module, nn.Linear) and shape == (module.in_features,):
            shape = (module.out_features,)
        elif not isinstance(module, SHAPE_KEEPING):
            return None
    return shape


def _output_shape(modules: list[nn.Module], shape: tuple[int, ...], where: str) -> tuple[int, ...]:
    known = _known_shape(modules, shape)
    if known is not None:
        return known
    probe = nn.Sequential(*modules).eval()
    try:
        with torch.no_grad():
            outputs = probe(torch.zeros(2, *shape))
    except RuntimeError as error:
        reason = str(error).strip().splitlines()[0][:200]
        raise ConfigError(f"{where}: does not fit input shape {list(shape)}: {reason}") from None
    if not isinstance(outputs, torch.Tensor):  # the loss, evaluation and export all take one tensor
        raise ConfigError(f"{where}: its forward returns {type(outputs).__name__}, not one tensor: return the "
                          "outputs the loss takes (logits, or the predicted values)")
    return tuple(outputs.shape[1:])


def from_layers(input_shape: list[int], layers: list[dict]) -> nn.Sequential:
    """A Sequential model from a layer list, checking each layer against the running shape."""
    shape = tuple(input_shape)
    modules: list[nn.Module] = []
    for index, layer in enumerate(layers):
        where = f"model.layers[{index}]"
        if not isinstance(layer, dict):
            raise ConfigError(f"{where}: must be a table such as {{ dense = 10 }}, got {layer!r}")
        added = _layer(layer, shape, where)
        shape = _output_shape(added, shape, where)
        modules.extend(added)
    if not modules:
        raise ConfigError("model.layers: empty")
    return nn.Sequential(*modules)


def _call_factory(factory: str, function: Callable, arguments: dict) -> Any:
    """Call the factory; arguments it does not take, or any exception it raises, become one line."""
    try:
        inspect.signature(function).bind(**arguments)
    except TypeError as error:  # arguments the factory does not take
        raise ConfigError(f"model.arguments: {factory!r} refused them: {error}") from None
    except ValueError:  # no signature to read (some builtins): the call itself says
        pass
    try:
        return function(**arguments)
    except Exception as error:
        raise ConfigError(f"model.factory: {factory!r} failed: {type(error).__name__}: {first_line(error)}") from None


def from_factory(factory: str, arguments: dict) -> nn.Module:
    """Import `package.module:function` and call it with the arguments."""
    if not isinstance(factory, str) or not isinstance(arguments, dict):
        raise ConfigError(f"model.factory: expected 'package.module:function' and a table of arguments, "
                          f"got {factory!r} and {arguments!r}")
    function = imported(factory, "model.factory")
    with current_folder_importable():  # what the factory imports as it runs comes from there too
        model = _call_factory(factory, function, arguments)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model.factory: {factory!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def build_model(spec: dict, run_dir: str | Path | None = None) -> nn.Module:
    """A fresh module from a spec (see the module docstring); `check_trusted` first for one read from a run.
    A model shipped by value is read from `run_dir`, the run directory it was written into."""
    if spec.get("factory"):
        return from_factory(spec["factory"], spec.get("arguments", {}))
    if spec.get("object"):
        return from_object(spec["object"], run_dir)
    return from_layers(spec["input"], spec["layers"])


def from_object(name: str, run_dir: str | Path | None) -> nn.Module:
    """The model shipped by value in the run directory's file `name`: a copy of the module, or what the callable
    there returns."""
    path, key = object_file(name, run_dir), object_key(name)
    shipped = load_object(path, key)
    if not isinstance(shipped, nn.Module) and callable(shipped):
        try:
            shipped = shipped()
        except Exception as error:
            raise ConfigError(f"{key}: the model's callable failed: {type(error).__name__}: "
                              f"{first_line(error)}") from None
    if not isinstance(shipped, nn.Module):
        raise ConfigError(f"{key}: {path} holds {type(shipped).__name__}, not a torch.nn.Module")
    return shipped


def object_key(name: str) -> str:
    """What messages call a model shipped by value: `model`, shoal.fit's argument, for the file fit writes (the
    user gave a module, not a job key), else the job's key `model.object`."""
    from shoal.fit_inputs import MODEL_FILE  # here, not at the top: its data imports are not every worker's to pay

    return "model" if name == MODEL_FILE else "model.object"


Trust = bool | str
"""True: any code may be run; a factory's name or a model file's path: that one only (the user named it again)."""


def codes_of(spec: dict) -> list[tuple[str, str]]:
    """(its key, its name) for each piece of code building or training the model would run: a factory, a
    model shipped by value, a job's train.loss naming a function."""
    found = [(f"model.{key}", spec[key]) for key in ("factory", "object") if spec.get(key)]
    if ":" in (spec.get("loss") or ""):
        found.append(("train.loss", spec["loss"]))
    return found


def code_of(spec: dict) -> tuple[str, str] | None:
    """The model's code, if building it runs any: (its key, its name)."""
    return next(iter(codes_of(spec)), None)


def untrusted(where: str, key: str, name: str) -> str:
    return (f"{where}: the model is built by code ({key} {name!r}); loading it would run that code: "
            "pass --trust-code (trust_code=True) if you trust this run directory")


def check_trusted(spec: dict, where: str, trust: Trust = False) -> None:
    """Refuse a spec read from a run directory whose code the user has not vouched for.

    The spec is data anyone could have written; its factory names any importable function
    (`os:system` among them) and a model file shipped by value is a pickle, so either is loaded only
    on the user's word.
    """
    for code in codes_of(spec):
        if trust is not True and not (isinstance(trust, str) and trust == code[1]):
            raise ConfigError(untrusted(where, *code))


def output_shape(model: nn.Module, input_shape: list[int]) -> tuple[int, ...]:
    """Shape of one sample's output, found by running a probe batch."""
    return _output_shape([model], tuple(input_shape), "model")
