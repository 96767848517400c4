"""The parameter-server header (version, rows) stays exact whatever the model's dtype.

bfloat16 holds integers exactly only up to 256 and float16 up to 2048: a header stored in the
model's dtype turned version 1_000_003 into 999_424. The header is int64 beside the payload, in
one buffer of bytes: checked here on the message itself, through the in-process communicator,
and through a Downpour and an EASGD server with a bfloat16 model resumed at a large version.
(Through gloo between two processes: tests/distributed/test_server_header.py.)
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from shoal.algorithms import make_algorithm
from shoal.cluster import messages
from shoal.cluster.fake import run_ranks
from shoal.cluster.messages import Message
from tests.distributed.common import CLASSES, FEATURES, small_model

VERSION, ROWS = 1_000_003, 70_001
HALF_TYPES = [torch.bfloat16, torch.float16]


def filled(dtype: torch.dtype, size: int = 7) -> Message:
    message = Message(size, dtype)
    message.version, message.rows = VERSION, ROWS
    message.payload.copy_(torch.linspace(-3.0, 3.0, size))
    return message


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_header_is_exact_in_a_half_precision_message(dtype):
    assert torch.tensor(float(VERSION), dtype=dtype).item() != VERSION  # the dtype alone would corrupt it
    sent = filled(dtype)
    received = Message(7, dtype)
    received.buffer.copy_(sent.buffer)  # what a receive does: the bytes, nothing else
    assert (received.version, received.rows) == (VERSION, ROWS)
    assert received.payload.dtype == dtype and received.dtype == dtype
    assert torch.equal(received.payload, sent.payload)
    kept = received.copy()
    received.version, received.rows = 0, 0  # the buffer reused for the next message
    assert (kept.version, kept.rows) == (VERSION, ROWS) and torch.equal(kept.payload, sent.payload)


def test_header_beyond_any_float_mantissa():
    message = Message(3, torch.float32)
    message.version, message.rows = 2**53 + 1, 2**40 + 3  # float64 could not hold the version either
    assert (message.version, message.rows) == (2**53 + 1, 2**40 + 3)


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_header_crosses_the_in_process_communicator(dtype):
    def rank(comm):
        if comm.rank == 1:
            comm.send(filled(dtype).buffer, 0, messages.UPDATE)
            return None
        message = Message(7, dtype)
        source = comm.receive(message.buffer, None, messages.UPDATE)
        return source, message.version, message.rows, message.payload.clone()

    (source, version, rows, payload), _ = run_ranks(2, rank)
    assert (source, version, rows) == (1, VERSION, ROWS)
    assert torch.equal(payload, filled(dtype).payload)


def resumed_rank(comm, name: str, options: dict, rounds: int) -> dict:
    """A bfloat16 job resumed at version VERSION: the server serves `rounds` updates, the trainer sends them."""
    model = small_model().to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    algorithm = make_algorithm(name, options)
    applied = []
    algorithm.setup(model, optimizer, comm, on_update=applied.append)
    algorithm.plan(rounds)
    algorithm.load_state_dict({**algorithm.state_dict(), "version": VERSION})
    if comm.rank == 0:
        algorithm.serve_epoch(0)
        return {"applied": applied, "report": algorithm.epoch_report(), "per_epoch": algorithm.updates_per_epoch()}
    generator = torch.Generator().manual_seed(comm.rank)
    for step in range(1, rounds + 1):
        inputs = torch.randn(8, FEATURES, generator=generator).to(torch.bfloat16)
        labels = torch.randint(0, CLASSES, (8,), generator=generator)
        optimizer.zero_grad(set_to_none=True)
        functional.cross_entropy(model(inputs), labels).backward()
        algorithm.after_backward(8)
        optimizer.step()
        algorithm.after_step(step)
    return {"version": algorithm.version}


@pytest.mark.parametrize("name, options", [("downpour", {}), ("easgd", {"period": 1})])
def test_a_bfloat16_server_counts_versions_exactly(name, options):
    server, trainer = run_ranks(2, lambda comm: resumed_rank(comm, name, options, rounds=3))
    assert server["applied"] == [VERSION + 1, VERSION + 2, VERSION + 3] and server["per_epoch"] == 3
    assert trainer["version"] == VERSION + 3
    assert server["report"]["staleness"]["max"] == 0  # each update started from the version the server held
