"""Two real gloo processes: a peer that sends a pickle (which would write a file when unpickled) through the raw
byte exchange is refused by the other before anything in it is read, and the group goes on with plain data
(the codec itself: tests/unit/cluster/test_codec.py); with the job's secret, a message a rank did not sign is
refused too (shoal.cluster.signed_messages)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from shoal.cluster.codec import CodecError, encode
from shoal.cluster.collectives import Communicator
from shoal.cluster.store import CONTEXT_VARIABLE, SECRET_VARIABLE
from tests.distributed.harness import run_processes
from tests.unit.cluster.test_codec import Planted


def refusal(receive) -> str:
    """The CodecError `receive()` raised ("" if none)."""
    try:
        receive()
    except CodecError as error:
        return str(error)
    return ""


def exchange(rank: int, world_size: int, marker: str) -> dict:
    """Rank 1 sends a live pickle, gathered then broadcast; rank 0 asks for objects both times."""
    comm = Communicator(rank, world_size)
    refused = []
    if rank == 1:  # the same collectives as rank 0's, with a pickle in them
        attack = pickle.dumps(Planted(Path(marker)))
        comm.all_gather_bytes(attack)
        comm.broadcast_bytes(attack, source=1)
    else:
        refused = [refusal(lambda: comm.all_gather_object("rank 0")),
                   refusal(lambda: comm.broadcast_object(None, source=1))]
    after = comm.all_gather_object({"rank": rank, "weights": torch.full((2,), float(rank), dtype=torch.bfloat16)})
    return {"refused": refused, "after": after, "ran": Path(marker).exists()}


def test_a_peers_pickle_is_refused_before_it_is_read_and_the_group_goes_on(tmp_path):
    marker = tmp_path / "ran"
    first, second = run_processes(exchange, 2, str(marker), timeout=60)
    assert first["refused"][0].startswith("refused rank 1's message: it is not shoal's plain data (it starts like "
                                          "a pickle of protocol")
    assert first["refused"][1].startswith("refused rank 1's message: it is not shoal's plain data")
    assert not first["ran"] and not second["ran"] and not marker.exists()
    for result in (first, second):
        assert [sent["rank"] for sent in result["after"]] == [0, 1]
        assert all(torch.equal(sent["weights"], torch.full((2,), float(rank), dtype=torch.bfloat16))
                   for rank, sent in enumerate(result["after"]))


def unsigned(rank: int, world_size: int, secret: str) -> dict:
    """Both ranks hold the job's secret (as shoal's launcher hands it); rank 1 sends plain data it did not sign, a
    run directory of its choosing, then signs its next message as the job does."""
    os.environ.update({SECRET_VARIABLE: secret, CONTEXT_VARIABLE: "instance/attempt/0"})
    comm = Communicator(rank, world_size)
    refused = []
    if rank == 1:
        comm.messages += 1  # its place in the exchange, as rank 0 counts it
        comm.broadcast_bytes(encode("/somewhere/else"), source=1)
    else:
        refused = [refusal(lambda: comm.broadcast_object(None, source=1))]
    after = comm.all_gather_object(f"rank {rank}")
    return {"refused": refused, "after": after}


def test_with_the_job_s_secret_an_unsigned_message_is_refused_and_signed_ones_are_read(tmp_path):
    first, second = run_processes(unsigned, 2, "0123456789abcdef0123456789abcdef", timeout=60)
    assert first["refused"][0].startswith("refused rank 1's message: it is not signed with the job's secret")
    assert first["after"] == second["after"] == ["rank 0", "rank 1"]
