"""Plain data to bytes and back, for what ranks send one another: a codec that cannot run code.

torch's object collectives (`all_gather_object`, `broadcast_object_list`) pickle what a rank sends
and unpickle what it receives, and unpickling runs whatever code the bytes name: anyone who
reaches the process group could run a command in every rank. What shoal's ranks tell one another
is plain data, so it travels as plain data: nothing a peer sends can run code in this process.

`encode` takes None, bool, int (64 bits), float (nan and infinities too), str, bytes, list, tuple,
dict and OrderedDict (keys None, bool, int, float, str or bytes; an OrderedDict's `_metadata`,
which a module's state dict carries, kept) and torch tensors of any dtype and shape, nested;
anything else is a `TypeError` naming its type (a dataclass is sent as a dict and rebuilt by its
receiver). Values
come back exactly: tuples as tuples, int keys as ints, tensors bit for bit, with their dtype,
shape and `requires_grad`, always in CPU memory (a CUDA tensor is copied to the CPU to be sent),
contiguous and sharing no storage. Subclasses of int, float and str (an IntEnum, NumPy's float64)
travel as their plain value.

The bytes are msgpack (whose reader builds only plain values) after a header, `MAGIC`, that
`decode` checks before it reads anything else: a pickle or any other bytes are refused whole,
unread, with a `CodecError` that says what they look like. Containers travel as msgpack arrays
tagged with their kind, and every value the reader builds is checked to be one this codec writes.
"""

from __future__ import annotations

from collections import OrderedDict

import msgpack
import torch

VERSION = 1
MAGIC = b"SHOAL-PLAIN" + bytes([VERSION])  # what every encoded value starts with
_STEM = MAGIC[:-1]

# the tag that opens each array: which container, or a tensor, it holds
LIST, TUPLE, ORDERED, TENSOR = 0, 1, 2, 3

SCALARS = (type(None), bool, int, float, str, bytes)
DTYPES = {str(dtype): dtype for dtype in (getattr(torch, name) for name in dir(torch))
          if isinstance(dtype, torch.dtype) and not str(dtype).startswith("torch.q")}  # quantized: no plain bytes
INT_RANGE = (-(2**63), 2**64 - 1)  # what msgpack holds


class CodecError(ValueError):
    """Bytes that are not a value this codec wrote (a pickle, garbage, a damaged message): nothing in them was
    used."""


def encode(value) -> bytes:
    """`value` (plain data and tensors, nested) as bytes that `decode` turns back into it; TypeError for what
    cannot travel."""
    return MAGIC + msgpack.packb(_tagged(value), use_bin_type=True, strict_types=True, datetime=False)


def decode(data: bytes, origin: str = "a peer") -> object:
    """The value `encode` gave `data`; CodecError for any other bytes, refused before they are read when they do
    not start with this codec's header. `origin` names the sender in the error."""
    data = bytes(data)
    if not data.startswith(_STEM):
        raise CodecError(f"refused {origin}'s message: it is not shoal's plain data ({_looks_like(data)}); "
                         "nothing in it was read")
    if len(data) < len(MAGIC):
        raise CodecError(f"refused {origin}'s message: it ends inside shoal's plain data header")
    if data[len(_STEM)] != VERSION:
        raise CodecError(f"refused {origin}'s message: written by plain data codec version {data[len(_STEM)]}, "
                         f"this shoal reads version {VERSION} (every machine must run the same shoal)")
    try:
        value = msgpack.unpackb(memoryview(data)[len(MAGIC):], raw=False, use_list=True, strict_map_key=False,
                                list_hook=_untagged, object_pairs_hook=_mapping, ext_hook=_no_extension)
        _check_item(value)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError, RuntimeError,
            msgpack.UnpackException) as error:
        raise CodecError(f"refused {origin}'s message: damaged plain data ({type(error).__name__}: {error})") \
            from None
    return value


def _looks_like(data: bytes) -> str:
    """What bytes that are not this codec's seem to be, for the refusal."""
    if data[:1] == b"\x80" and len(data) > 1:
        return f"it starts like a pickle of protocol {data[1]}"
    if not data:
        return "it is empty"
    return f"it starts with {data[:16]!r}"


# ---------------------------------------------------------------- encoding


def _tagged(value):
    """`value` as msgpack's plain types: scalars and dicts as they are, other containers and tensors as arrays
    opening with their tag."""
    kind = type(value)
    if kind in SCALARS:
        if kind is int and not INT_RANGE[0] <= value <= INT_RANGE[1]:
            raise TypeError(f"cannot send an int of {value.bit_length()} bits between ranks (64 at most)")
        return value
    if kind is dict:
        return {_key(key): _tagged(item) for key, item in value.items()}
    if kind is list:
        return [LIST, *map(_tagged, value)]
    if kind is tuple:
        return [TUPLE, *map(_tagged, value)]
    if kind is OrderedDict:
        metadata = getattr(value, "_metadata", None)
        return [ORDERED, _tagged(metadata), {_key(key): _tagged(item) for key, item in value.items()}]
    if kind is torch.Tensor:
        return _tensor_array(value)
    for plain in (int, float, str):  # NumPy's float64, an IntEnum: their plain value
        if isinstance(value, plain):
            return _tagged(plain(value))
    raise TypeError(f"cannot send a value of type {_type_name(value)} between ranks: only None, bool, int, float, "
                    "str, bytes, list, tuple, dict and tensors travel (send a dataclass or an object as a dict of "
                    "those)")


def _key(key):
    """A dict key: a scalar (msgpack's map keys cannot be arrays, so a tuple key has no plain form)."""
    if type(key) not in SCALARS and not isinstance(key, (int, float, str)):
        raise TypeError(f"cannot send a dict with a key of type {_type_name(key)} between ranks: keys travel as "
                        "None, bool, int, float, str or bytes")
    return _tagged(key)


def _tensor_array(tensor: torch.Tensor) -> list:
    """[TENSOR, dtype, shape, requires_grad, its bytes in C order], from a copy in CPU memory."""
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_meta or str(tensor.dtype) not in DTYPES:
        raise TypeError(f"cannot send a {tensor.layout} {tensor.dtype} tensor on {tensor.device} between ranks: "
                        "only dense tensors with data travel")
    local = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()
    data = local.reshape(-1).view(torch.uint8).numpy().tobytes()
    return [TENSOR, str(tensor.dtype), _tagged(list(tensor.shape)), tensor.requires_grad, data]


def _type_name(value) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


# ---------------------------------------------------------------- decoding


CONTAINERS = (list, tuple, dict, OrderedDict, torch.Tensor)


def _check_item(item) -> None:
    """Refuse a value msgpack built that this codec never writes (its timestamps, untagged arrays)."""
    if type(item) not in SCALARS and type(item) not in CONTAINERS:
        raise TypeError(f"a value of type {_type_name(item)}, which this codec never writes")


def _untagged(array: list):
    """An array's value by its opening tag (msgpack calls this for every array, innermost first)."""
    if not array or type(array[0]) is not int:
        raise ValueError("an array without its tag")
    tag, items = array[0], array[1:]
    for item in items:
        _check_item(item)
    if tag == LIST:
        return items
    if tag == TUPLE:
        return tuple(items)
    if tag == ORDERED:
        return _ordered(items)
    if tag == TENSOR:
        return _tensor(*items)
    raise ValueError(f"an array of unknown tag {tag}")


def _mapping(pairs: list) -> dict:
    for key, item in pairs:
        _check_item(key)
        _check_item(item)
    return dict(pairs)


def _no_extension(code: int, data: bytes):
    raise ValueError(f"a msgpack extension of type {code}, which this codec never writes")


def _ordered(items: list) -> OrderedDict:
    metadata, content = items
    if type(content) is not dict or not (metadata is None or type(metadata) in (dict, OrderedDict)):
        raise ValueError("an OrderedDict that is not (metadata, a map)")
    ordered = OrderedDict(content)
    if metadata is not None:
        ordered._metadata = metadata
    return ordered


def _tensor(dtype_name, shape, requires_grad, data) -> torch.Tensor:
    """A tensor from what `_tensor_array` wrote, checked: a known dtype, a shape of sizes, and exactly its bytes."""
    dtype = DTYPES.get(dtype_name) if type(dtype_name) is str else None
    if dtype is None:
        raise ValueError(f"a tensor of unknown dtype {dtype_name!r}")
    if type(shape) is not list or any(type(size) is not int or size < 0 for size in shape):
        raise ValueError(f"a tensor of shape {shape!r}")
    if type(requires_grad) is not bool or type(data) is not bytes:
        raise ValueError("a tensor without its flag and bytes")
    count = 1
    for size in shape:
        count *= size
    if len(data) != count * dtype.itemsize:
        raise ValueError(f"a {dtype_name} tensor of shape {shape} in {len(data)} bytes")
    if count == 0:
        tensor = torch.empty(shape, dtype=dtype)
    else:
        tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
    return tensor.requires_grad_(requires_grad)
