"""The parameter-server header (version, rows) stays exact through gloo between two processes, whatever the
model's dtype (the message itself and the in-process communicator: tests/unit/algorithms/test_server_header.py)."""

from __future__ import annotations

import pytest
import torch

from shoal.cluster import messages
from shoal.cluster.collectives import Communicator
from shoal.cluster.messages import Message
from tests.distributed.harness import run_processes
from tests.unit.algorithms.test_server_header import HALF_TYPES, ROWS, VERSION, filled


def gloo_exchange(rank: int, world_size: int, dtype: torch.dtype):
    """Rank 1 sends an update, rank 0 answers with a reply one version on."""
    comm = Communicator(rank, world_size)
    message = Message(7, dtype)
    if rank == 1:
        comm.send(filled(dtype).buffer, 0, messages.UPDATE)
        comm.receive(message.buffer, 0, messages.REPLY)
        return message.version, message.rows, message.payload.float()
    source = comm.receive(message.buffer, None, messages.UPDATE)
    message.version += 1
    comm.send(message.buffer, source, messages.REPLY)
    return message.version, message.rows, message.payload.float()


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_header_crosses_gloo(dtype):
    server, trainer = run_processes(gloo_exchange, 2, dtype, timeout=60.0)
    expected = filled(dtype).payload.float()
    assert server[:2] == (VERSION + 1, ROWS) and trainer[:2] == (VERSION + 1, ROWS)
    assert torch.equal(server[2], expected) and torch.equal(trainer[2], expected)
