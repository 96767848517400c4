"""Gradient compression: what a bucket of gradients becomes on the wire, and how it is summed.

On commodity Ethernet a model of millions of parameters sends more bytes each step than the link
carries while the step computes; `algorithm.compression` trades exactness for bytes. Every compressor
turns each rank's contribution (a flat bucket: the rows-weighted sum of its gradients) into the sum
over the ranks, the same bytes on every rank, so the replicas never diverge:

- `Exact` ("none"): an all-reduce in fp32.
- `HalfPrecision` ("bf16", "fp16"): the bucket in 2 bytes a number. A reduce-scatter done as one
  all-to-all of chunks, each chunk summed in fp32 by its owner, then the summed chunks all-gathered:
  half the bytes of "none", rounded once after an fp32 sum (where an all-reduce in half precision,
  as DDP's fp16 hook does, rounds after every addition). Between two ranks the one addition a
  half-precision all-reduce makes (gloo and NCCL add in fp32 and round) is already that, so it is
  one all-reduce.
- `PowerSGD` ("powersgd"): Vogels et al. (2019). A parameter seen as a matrix M (n x m: its first
  dimension by the rest) is sent as P = M Q (n x r) and Q = M^T P̂ (m x r), P̂ the orthonormal basis of
  the summed P; the sum of the ranks' matrices is approximated by P̂ (sum of Q)^T. What a rank's
  approximation leaves out (M - P̂ P̂^T M) is added to its next step's matrix (error feedback), so
  nothing is lost, only delayed. Q starts from the job's seed and is warm-started from the last step.
  Parameters where it does not pay (biases, r(n+m) >= n*m) go exact in the first all-reduce.

Compressors keep their state (PowerSGD's Q and error buffers) in `state_dict`, saved in each rank's
checkpoint so a resume continues bit for bit. torch's PowerSGD DDP hook is the reference for the
math but is not used: it is a DDP communication hook (shoal does not wrap the model in DDP) and
fails over gloo in torch 2.13 ("Received data size doesn't match expected size").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from shoal.bucket_rules import factored
from shoal.errors import ConfigError

NAMES = ("none", "bf16", "fp16", "powersgd")


class Compressor:
    """Sums a bucket over the ranks of a communicator; subclasses choose what travels (by default: everything,
    exact)."""

    name = "none"

    def sum_(self, flat: torch.Tensor, shapes: Sequence[torch.Size], key: str, comm,
             names: Sequence[str] | None = None) -> None:
        """Replace `flat` (this rank's contribution: the tensors of `shapes`, in order) by the sum over `comm`'s
        ranks. State such as error feedback is kept per tensor, under `names` (one per shape: the same tensor
        whatever bucket it travels in) or else "`key`.i"."""
        comm.all_reduce_sum_(flat)

    def wire_numbers(self, shapes: Sequence[torch.Size]) -> tuple[int, int]:
        """(numbers a rank contributes to the bucket's exchange, bytes per number): what the planner prices."""
        return sum(math.prod(shape) for shape in shapes), 4

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned."""

    def forget_errors(self) -> None:
        """Drop this rank's error feedback (a resume on another number of workers: rank 0's errors are its own)."""


class Exact(Compressor):
    """An all-reduce of the fp32 numbers: the exact sum (the base class's)."""


class HalfPrecision(Compressor):
    """2 bytes a number on the wire, summed in fp32 (see the module's docstring)."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.name = "bf16" if dtype == torch.bfloat16 else "fp16"

    def sum_(self, flat, shapes, key, comm, names=None) -> None:
        size = comm.world_size
        if size == 1:
            return
        if size == 2:  # a + b rounded once is the fp32 sum rounded once: one all-reduce, no chunks to sum
            half = flat.to(self.dtype)
            comm.all_reduce_sum_(half)
            flat.copy_(half)
            return
        chunk = -(-flat.numel() // size)
        padded = torch.zeros(chunk * size, dtype=self.dtype, device=flat.device)
        padded[: flat.numel()].copy_(flat)
        received = torch.empty_like(padded)
        comm.all_to_all_(received, padded)  # chunk j of every rank, to rank j
        pieces = received.view(size, chunk)
        mine = pieces[0].float()
        for piece in pieces[1:]:
            mine.add_(piece)  # summed in fp32, in rank order
        gathered = received  # its chunks are summed: reused for the gather
        comm.all_gather_into_(gathered, mine.to(self.dtype))
        flat.copy_(gathered[: flat.numel()])

    def wire_numbers(self, shapes) -> tuple[int, int]:
        return sum(math.prod(shape) for shape in shapes), 2


@dataclass
class _Matrix:
    """Where one compressed parameter lies in its bucket, and its matrix shape."""

    offset: int
    rows: int
    columns: int
    index: int = 0  # its place among the bucket's tensors

    @property
    def size(self) -> int:
        return self.rows * self.columns


class PowerSGD(Compressor):
    """Low-rank compression with error feedback (see the module's docstring)."""

    name = "powersgd"

    def __init__(self, rank: int = 4, seed: int = 0):
        check_compression(self.name, rank)
        self.rank, self.seed = rank, seed
        self.queries: dict[str, torch.Tensor] = {}  # Q of each matrix, the same on every rank
        self.errors: dict[str, torch.Tensor] = {}  # what this rank's approximations left out

    def compressible(self, shape: torch.Size) -> bool:
        return factored(shape, self.rank) is not None

    def layout(self, shapes) -> tuple[list[_Matrix], list[tuple[int, int]]]:
        """The compressed matrices of a bucket, and the (offset, size) pieces that go exact."""
        matrices, exact, offset = [], [], 0
        for index, shape in enumerate(shapes):
            size = math.prod(shape)
            if self.compressible(shape):
                matrices.append(_Matrix(offset, shape[0], size // shape[0], index))
            else:
                exact.append((offset, size))
            offset += size
        return matrices, exact

    def wire_numbers(self, shapes) -> tuple[int, int]:
        matrices, exact = self.layout(shapes)
        return sum(self.rank * (m.rows + m.columns) for m in matrices) + sum(size for _, size in exact), 4

    def query(self, name: str, matrix: _Matrix, like: torch.Tensor) -> torch.Tensor:
        """Q of a matrix: drawn from the job's seed and the matrix's name the first time, the same on every rank."""
        if name not in self.queries:
            generator = torch.Generator().manual_seed(hash_seed(self.seed, name))
            self.queries[name] = torch.randn(matrix.columns, self.rank, generator=generator).to(like)
        query = self.queries[name]
        if query.stride(0) != 1:  # kept as Q^T's rows (see sum_), as the warm start leaves it
            query = self.queries[name] = query.T.contiguous().T
        if query.shape != (matrix.columns, self.rank):  # a checkpoint of another model or rank: never guess
            raise ConfigError(f"algorithm.compression_rank: the saved PowerSGD state of {name} is "
                              f"{tuple(query.shape)}, this job's is {(matrix.columns, self.rank)}")
        return query

    def sum_(self, flat, shapes, key, comm, names=None) -> None:
        matrices, exact = self.layout(shapes)
        names = [names[m.index] if names is not None else f"{key}.{index}" for index, m in enumerate(matrices)]
        views = [flat[m.offset : m.offset + m.size].view(m.rows, m.columns) for m in matrices]
        for name, view in zip(names, views):
            if name in self.errors:
                view.add_(self.errors[name])  # error feedback: last step's remainder goes out now
        # P^T = Q^T M^T (r x n): its rows in one pass each over M, and the same bits wherever M lies in the bucket
        # (M Q with Q stored transposed is as fast but rounds by M's alignment, which the bucket's cut moves)
        projections = [torch.mm(self.query(name, m, flat).T, view.T) for name, m, view in zip(names, matrices, views)]
        first = torch.cat([p.reshape(-1) for p in projections] + [flat[o : o + s] for o, s in exact])
        comm.all_reduce_sum_(first)
        bases, offset = [], 0
        for projection in projections:
            summed = first[offset : offset + projection.numel()].view_as(projection)
            bases.append(torch.linalg.qr(summed.T, mode="reduced").Q)
            offset += projection.numel()
        for start, size in exact:
            flat[start : start + size].copy_(first[offset : offset + size])
            offset += size
        # Q^T = P̂^T M, r x m: a thin factor times the matrix reads it once in its own order; M^T P̂ took 8x longer
        local = [torch.mm(basis.T, view) for view, basis in zip(views, bases)]
        for name, view, basis, query in zip(names, views, bases, local):
            error = self.errors.get(name)
            if error is None or error.shape != view.shape:
                error = self.errors[name] = torch.empty_like(view)
            torch.addmm(view, basis, query, alpha=-1, out=error)  # what this rank's approximation leaves out
        if not local:  # nothing factored in this bucket (the same on every rank): no second collective
            return
        second = torch.cat([q.reshape(-1) for q in local])
        comm.all_reduce_sum_(second)
        offset = 0
        for name, view, basis, query in zip(names, views, bases, local):
            summed = second[offset : offset + query.numel()].view_as(query)
            torch.mm(basis, summed, out=view)
            self.queries[name] = summed.clone().T  # warm start: the next step's Q (m x r, its rows r apart)
            offset += query.numel()

    def state_dict(self) -> dict:
        return {"queries": {k: v.clone() for k, v in self.queries.items()},
                "errors": {k: v.clone() for k, v in self.errors.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.queries = {k: v.clone() for k, v in state.get("queries", {}).items()}
        self.errors = {k: v.clone() for k, v in state.get("errors", {}).items()}

    def forget_errors(self) -> None:
        self.errors = {}


def hash_seed(seed: int, name: str) -> int:
    """A seed from the job's seed and a name, the same in every process (Python's hash() of a str is not)."""
    value = seed & 0xFFFFFFFF
    for byte in name.encode():
        value = (value * 1_000_003 + byte) % (2**61 - 1)
    return value


def check_compression(compression, rank) -> None:
    """`algorithm.compression` and `algorithm.compression_rank` as a job file may give them."""
    if compression not in NAMES:
        raise ConfigError(f"algorithm.compression: unknown compression {compression!r}; "
                          f"choose one of {', '.join(NAMES)}")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConfigError(f"algorithm.compression_rank: must be an integer >= 1, got {rank!r}")


def make_compressor(name: str, rank: int = 4, seed: int = 0) -> Compressor:
    """The compressor `algorithm.compression` names."""
    if name == "none":
        return Exact()
    if name in ("bf16", "fp16"):
        return HalfPrecision(torch.bfloat16 if name == "bf16" else torch.float16)
    if name == "powersgd":
        return PowerSGD(rank, seed)
    raise ConfigError(f"algorithm.compression: unknown compression {name!r}; choose one of {', '.join(NAMES)}")
