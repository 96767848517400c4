"""The models of benchmarks/comm.py and benchmarks/step_cost.py and what one step of each puts on the link,
for every compression.

The models are shoal layer lists, so shoal's jobs and the DDP peer (benchmarks/comm_ddp.py) build the
same modules with `shoal.model.from_layers`. benchmarks/comm.py runs the first two (COMM_MODELS) unless
asked for others. The bytes follow the `sync` algorithm's exchange: fp32
gradients for "none", 2 bytes a number for bf16 and fp16, and for PowerSGD the factors P (n x r) and
Q (m x r) of every parameter seen as an n x m matrix (first dimension x the rest) that they shrink,
the other parameters exact.
"""

from __future__ import annotations

from torch import nn

from shoal.algorithms.compression import make_compressor
from shoal.model import from_layers

MODELS = {
    "mlp": {
        "what": "784-2048-512-10 MLP, relu",
        "input": [28, 28],
        "layers": [{"dense": 2048, "activation": "relu"}, {"dense": 512, "activation": "relu"}, {"dense": 10}],
    },
    "cnn": {
        "what": "CNN: conv 1->16 5x5, maxpool 2, conv 16->32 5x5, maxpool 2, dense 512->10; relu",
        "input": [28, 28],
        "layers": [{"conv2d": 16, "kernel": 5, "activation": "relu"}, {"maxpool": 2},
                   {"conv2d": 32, "kernel": 5, "activation": "relu"}, {"maxpool": 2}, {"dense": 10}],
    },
    "perceptron": {
        "what": "cNeural's 784-40-10 perceptron, sigmoid",
        "input": [784],
        "layers": [{"dense": 40, "activation": "sigmoid"}, {"dense": 10}],
    },
    "cnn-dense": {
        "what": "CNN with a dense head: conv 1->16 5x5, maxpool 2, dense 2304->20->10; relu",
        "input": [28, 28],
        "layers": [{"conv2d": 16, "kernel": 5, "activation": "relu"}, {"maxpool": 2},
                   {"dense": 20, "activation": "relu"}, {"dense": 10}],
    },
}
COMM_MODELS = ("mlp", "cnn")
COMPRESSIONS = ("none", "bf16", "fp16", "powersgd")


def build(name: str) -> nn.Module:
    return from_layers(MODELS[name]["input"], MODELS[name]["layers"])


def parameters(name: str) -> int:
    return sum(parameter.numel() for parameter in build(name).parameters())


def step_bytes(name: str, compression: str, rank: int = 4) -> int:
    """Bytes of one step's exchange before the ring's 2(N-1)/N: what each worker contributes (the compressor's
    own count, so the figure follows what `sync` sends)."""
    shapes = [parameter.shape for parameter in build(name).parameters()]
    numbers, size = make_compressor(compression, rank).wire_numbers(shapes)
    return numbers * size


def wire_seconds(step: int, steps: int, workers: int, bits_per_second: float) -> float:
    """Seconds the link needs for `steps` ring all-reduces of `step` bytes among `workers`."""
    return steps * step * 2 * (workers - 1) / workers / (bits_per_second / 8)
