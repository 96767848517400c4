"""The plain data codec ranks send one another values with: exact round trips, and refusal of anything else
(a pickle above all) before it is read. The same exchange between real processes:
tests/processes/cluster/test_codec.py."""

from __future__ import annotations

import enum
import math
import pickle
import struct
from collections import OrderedDict, namedtuple
from dataclasses import dataclass
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.cluster.codec import DTYPES, MAGIC, CodecError, decode, encode
from shoal.cluster.collectives import Communicator
from shoal.cluster.fake import run_ranks


def round_trip(value):
    return decode(encode(value))


def same_bits(first: float, second: float) -> bool:
    return struct.pack("<d", first) == struct.pack("<d", second)


# ---------------------------------------------------------------- round trips


def test_scalars_come_back_with_their_type_and_bits():
    values = [None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 0.1, -0.0, math.inf, -math.inf, math.nan,
              "", "héllo ✓", b"", b"\x00\x80\xff"]
    back = round_trip(values)
    assert [type(value) for value in back] == [type(value) for value in values]
    for sent, received in zip(values, back, strict=True):
        assert same_bits(sent, received) if type(sent) is float else sent == received


def test_containers_keep_their_kind_order_and_key_types():
    value = {"list": [1, [2, (3, 4)]], "tuple": (1, ("a", [b"b"])), "empty": ([], (), {}), 7: "int key",
             -1: None, 2.5: "float key", None: "none key", True: "bool key", b"k": "bytes key",
             "nested": {0: {1: (2,)}}}
    back = round_trip(value)
    assert back == value
    assert list(back) == list(value)
    assert type(back["tuple"]) is tuple and type(back["tuple"][1]) is tuple and type(back["tuple"][1][1]) is list
    assert type(back["empty"]) is tuple and [type(item) for item in back["empty"]] == [list, tuple, dict]
    assert type(next(iter(back["nested"]))) is int and type(back["nested"][0][1]) is tuple
    assert [type(key) for key in back] == [type(key) for key in value]  # True stays a bool, 7 an int


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_tensors_of_every_dtype_come_back_bit_for_bit(name):
    dtype = DTYPES[name]
    generator = torch.Generator().manual_seed(3)
    data = torch.randint(0, 256, (2 * 3 * 4 * dtype.itemsize,), dtype=torch.uint8, generator=generator)
    tensor = data.view(dtype).reshape(2, 3, 4)  # every bit pattern, nan and subnormals among them
    back = round_trip(tensor)
    assert type(back) is torch.Tensor and back.dtype == dtype and back.shape == tensor.shape
    assert torch.equal(back.reshape(-1).view(torch.uint8), data)


def test_tensors_of_any_shape_layout_and_flag():
    tensors = [torch.tensor(2.5, dtype=torch.bfloat16), torch.empty(0, 3), torch.empty(2, 0, dtype=torch.int64),
               torch.arange(12.0).reshape(3, 4).t(), torch.arange(10)[::3], torch.randn(3, requires_grad=True),
               torch.randn(2, dtype=torch.complex64).conj(), torch.tensor([True, False])]
    for sent, received in zip(tensors, round_trip(tensors), strict=True):
        assert (received.dtype, received.shape, received.requires_grad) == (sent.dtype, sent.shape, sent.requires_grad)
        assert torch.equal(received, sent.detach().resolve_conj())
        assert received.is_contiguous() and received.device.type == "cpu"


def test_received_tensors_are_copies():
    sent = torch.zeros(3)
    received = round_trip(sent)
    received += 1
    assert torch.equal(sent, torch.zeros(3))


def test_a_module_state_dict_comes_back_with_its_metadata_and_loads():
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    module[1].running_mean.add_(1.5)
    state = module.state_dict()
    back = round_trip({"model": state})["model"]
    assert type(back) is OrderedDict and list(back) == list(state)
    assert back._metadata == state._metadata
    other = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    other.load_state_dict(back)
    assert all(torch.equal(other.state_dict()[key], value) for key, value in state.items())


def test_an_optimizer_state_round_trips_with_its_int_keys_and_tuples():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, betas=(0.8, 0.9))
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    back = round_trip(state)
    assert list(back["state"]) == [0, 1] and back["param_groups"][0]["betas"] == (0.8, 0.9)
    assert all(torch.equal(back["state"][0][key], state["state"][0][key]) for key in state["state"][0])
    torch.optim.Adam(model.parameters()).load_state_dict(back)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_a_cuda_tensor_travels_and_arrives_in_cpu_memory():
    tensor = torch.randn(4, device="cuda")
    back = round_trip(tensor)
    assert back.device.type == "cpu" and torch.equal(back, tensor.cpu())


class Level(enum.IntEnum):
    HIGH = 2


def test_subclasses_of_numbers_and_strings_travel_as_their_plain_value():
    back = round_trip([np.float64(0.25), Level.HIGH])
    assert back == [0.25, 2] and [type(value) for value in back] == [float, int]


PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text()
    | st.binary(),
    lambda children: st.lists(children) | st.tuples(children, children)
    | st.dictionaries(st.integers(-(2**63), 2**63 - 1) | st.text(), children),
    max_leaves=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PLAIN)
def test_any_nesting_of_plain_values_round_trips_exactly(value):
    back = round_trip(value)
    assert back == value and repr(back) == repr(value)  # repr tells a tuple from a list, 1 from 1.0 and True


# ---------------------------------------------------------------- what cannot travel


@dataclass
class Memory:
    peak: int = 0


Pair = namedtuple("Pair", "first second")


@pytest.mark.parametrize(("value", "named"), [
    (Memory(), "Memory"), (object(), "object"), ({1, 2}, "set"), (frozenset(), "frozenset"),
    (bytearray(b"x"), "bytearray"), (Path("/tmp"), "Path"), (Pair(1, 2), "Pair"),
    (torch.nn.Parameter(torch.ones(1)), "Parameter"), (torch.float32, "dtype"), (np.ones(2), "ndarray"),
    ([1, {"deep": [Memory()]}], "Memory"), (lambda: 0, "function"),
])
def test_anything_else_is_a_type_error_naming_its_type(value, named):
    with pytest.raises(TypeError, match=rf"cannot send a value of type \S*{named} between ranks"):
        encode(value)


def test_keys_that_are_not_scalars_and_ints_past_64_bits_are_refused():
    with pytest.raises(TypeError, match="a key of type tuple"):
        encode({(1, 2): 3})
    with pytest.raises(TypeError, match="an int of 65 bits"):
        encode([2**64])
    with pytest.raises(TypeError, match="sparse"):
        encode(torch.eye(2).to_sparse())


# ---------------------------------------------------------------- what is refused on arrival


class Planted:
    """What an attacker sends: unpickling it runs a command (here it only writes a file)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_a_pickle_is_refused_unread(tmp_path):
    marker = tmp_path / "ran"
    payload = pickle.dumps(Planted(marker))
    with pytest.raises(CodecError, match=r"refused rank 1's message: it is not shoal's plain data \(it starts like "
                                         r"a pickle of protocol \d+\); nothing in it was read"):
        decode(payload, "rank 1")
    assert not marker.exists()
    pickle.loads(payload)  # the payload is live: the codec, not luck, kept it from running
    assert marker.read_text() == "ran"


def test_a_pickle_after_the_header_is_damaged_data_not_code(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(CodecError, match="damaged plain data"):
        decode(MAGIC + pickle.dumps(Planted(marker)))
    assert not marker.exists()


def plain(value) -> bytes:
    """`value` packed as msgpack behind the header, as a peer could craft it."""
    return MAGIC + msgpack.packb(value, use_bin_type=True)


@pytest.mark.parametrize(("payload", "says"), [
    (b"", "it is empty"),
    (b"GET / HTTP/1.1", "it starts with b'GET / HTTP/1.1'"),
    (MAGIC[:-1], "ends inside shoal's plain data header"),
    (MAGIC[:-1] + b"\x09" + msgpack.packb(1), "codec version 9, this shoal reads version 1"),
    (MAGIC, "damaged plain data"),
    (encode({"a": [1, 2, 3]})[:-2], "damaged plain data"),
    (encode(1) + b"\x01", "damaged plain data"),
    (plain([]), "an array without its tag"),
    (plain(["list"]), "an array without its tag"),
    (plain([9, 1]), "unknown tag 9"),
    (plain(msgpack.ExtType(5, b"x")), "extension of type 5"),
    (plain(msgpack.Timestamp(1, 0)), "Timestamp, which this codec never writes"),
    (plain({"a": msgpack.Timestamp(1, 0)}), "Timestamp, which this codec never writes"),
    (plain([3, "torch.float32", [0, 2], False, b"\x00" * 7]), "torch.float32 tensor of shape \\[2\\] in 7 bytes"),
    (plain([3, "os.system", [0, 1], False, b"\x00"]), "unknown dtype 'os.system'"),
    (plain([3, "torch.uint8", [0, -1], False, b""]), "shape \\[-1\\]"),
    (plain([3, "torch.int64", [0, 1], True, b"\x00" * 8]), "RuntimeError"),
    (plain([2, None, [0, 1]]), "an OrderedDict that is not"),
])
def test_bytes_that_are_not_this_codecs_are_refused_with_what_they_are(payload, says):
    with pytest.raises(CodecError, match=says):
        decode(payload)


# ---------------------------------------------------------------- the communicators use it


def test_a_world_of_one_sends_values_through_the_codec_too():
    comm = Communicator(0, 1)
    value = {"hosts": ("a", 1)}
    gathered = comm.all_gather_object(value)
    assert gathered == [value] and gathered[0] is not value and type(gathered[0]["hosts"]) is tuple
    assert comm.broadcast_object([1]) == [1]
    with pytest.raises(TypeError, match="Memory"):
        comm.all_gather_object(Memory())
    with pytest.raises(CodecError, match="rank 0's message.*pickle"):
        decode(comm.all_gather_bytes(pickle.dumps(1))[0], "rank 0")


def test_the_fake_communicator_refuses_what_a_real_one_could_not_send():
    def body(comm):
        return comm.broadcast_object(Memory() if comm.rank == 0 else None)

    with pytest.raises(TypeError, match="cannot send a value of type .*Memory between ranks"):
        run_ranks(2, body)


def test_the_fake_communicator_refuses_a_peers_pickle(tmp_path):
    marker = tmp_path / "ran"

    def body(comm):
        if comm.rank == 1:  # the same exchange as rank 0's objects, with a pickle in it
            return comm.all_gather_bytes(pickle.dumps(Planted(marker)))
        return comm.all_gather_object("fine")

    with pytest.raises(CodecError, match="rank 1's message: it is not shoal's plain data .*pickle"):
        run_ranks(2, body)
    assert not marker.exists()
