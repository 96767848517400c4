"""Two real gloo processes: a peer that sends a pickle (which would write a file when unpickled) through the raw
byte exchange is refused by the other before anything in it is read, and the group goes on with plain data
(the codec itself: tests/unit/cluster/test_codec.py)."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from shoal.cluster.codec import CodecError
from shoal.cluster.collectives import Communicator
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
