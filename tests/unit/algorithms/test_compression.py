"""Gradient compression against values computed by hand: exact sums, half precision rounded once after an fp32
sum, PowerSGD's low-rank step and its error feedback, every rank with the same bytes, and a saved state that
continues bit for bit. Ranks are threads of the fake communicator: no processes.
"""

from __future__ import annotations

import pytest
import torch

from shoal.algorithms.compression import Exact, HalfPrecision, PowerSGD, hash_seed, make_compressor
from shoal.cluster.fake import run_ranks
from shoal.errors import ConfigError


def summed_on_ranks(compressor_for, contributions: list[torch.Tensor], shapes, key: str = "b") -> list[torch.Tensor]:
    """Each rank's contribution through `compressor_for(rank).sum_`: what every rank holds afterwards."""

    def rank(comm):
        flat = contributions[comm.rank].clone()
        compressor_for(comm.rank).sum_(flat, shapes, key, comm)
        return flat

    return run_ranks(len(contributions), rank, timeout=20)


def in_rank_order(tensors: list[torch.Tensor]) -> torch.Tensor:
    total = tensors[0].clone()
    for tensor in tensors[1:]:
        total += tensor
    return total


def assert_same_bytes(results: list[torch.Tensor]) -> None:
    for result in results[1:]:
        assert torch.equal(result, results[0])


# --- none and half precision


@pytest.mark.parametrize("world_size", [2, 3])
def test_exact_is_the_sum_on_every_rank(world_size):
    generator = torch.Generator().manual_seed(world_size)
    contributions = [torch.randn(11, generator=generator) for _ in range(world_size)]
    results = summed_on_ranks(lambda rank: Exact(), contributions, [torch.Size([11])])
    assert_same_bytes(results)
    assert torch.equal(results[0], in_rank_order(contributions))
    assert Exact().wire_numbers([torch.Size([3, 4]), torch.Size([5])]) == (17, 4)


def rounded_once(contributions: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Each rank's numbers in `dtype` (what it sends), summed in fp32, the sum rounded once to `dtype`."""
    return in_rank_order([c.to(dtype).float() for c in contributions]).to(dtype).float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_the_fp32_sum_rounded_once(dtype):
    # 7 numbers on 3 ranks: chunks of 3, the last padded; 0.1 and 1/3 are not representable in either type
    contributions = [torch.tensor([0.5, -1.25, 3.0, 0.1, 2.0**-3, 1 / 3, 96.0]),
                     torch.tensor([0.25, 1.25, -1.0, 0.1, 2.0**-3, 1 / 3, 64.0]),
                     torch.tensor([0.125, 0.5, 0.0, 0.1, -(2.0**-2), 1 / 3, 32.0])]
    results = summed_on_ranks(lambda rank: HalfPrecision(dtype), contributions, [torch.Size([7])])
    assert_same_bytes(results)
    expected = rounded_once(contributions, dtype)
    assert torch.equal(results[0], expected)
    # the representable numbers come back exact
    assert results[0][[0, 1, 2, 4, 6]].tolist() == [0.875, 0.5, 2.0, 0.0, 192.0]
    assert results[0][3].item() == pytest.approx(0.3, rel=1e-2) and results[0][3].item() != 0.3
    assert HalfPrecision(dtype).wire_numbers([torch.Size([3, 4]), torch.Size([5])]) == (17, 2)
    assert HalfPrecision(dtype).name == {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


@pytest.mark.parametrize("dtype, half_ulp", [(torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)])
def test_half_precision_sums_in_fp32(dtype, half_ulp):
    """1 + h + h, h half an ulp of 1: summed in the half type each addition rounds back to 1 (ties to even);
    summed in fp32 it is 1 + 2h, representable in the half type."""
    contributions = [torch.tensor([1.0, 0.0]), torch.tensor([half_ulp, 0.0]), torch.tensor([half_ulp, 0.0])]
    in_half = contributions[0].to(dtype)
    for contribution in contributions[1:]:
        in_half = in_half + contribution.to(dtype)
    assert in_half[0].item() == 1.0  # the case tells the two apart
    results = summed_on_ranks(lambda rank: HalfPrecision(dtype), contributions, [torch.Size([2])])
    assert_same_bytes(results)
    assert results[0].tolist() == [1.0 + 2 * half_ulp, 0.0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("length", [1, 5, 8])
def test_half_precision_pads_lengths_the_world_does_not_divide(dtype, length):
    generator = torch.Generator().manual_seed(length)
    contributions = [torch.randn(length, generator=generator) for _ in range(3)]
    results = summed_on_ranks(lambda rank: HalfPrecision(dtype), contributions, [torch.Size([length])])
    assert_same_bytes(results)
    assert results[0].shape == (length,)
    # the fp32 sum of three half-precision numbers of similar size is exact; so the result is bit for bit
    assert torch.equal(results[0], rounded_once(contributions, dtype))


# --- PowerSGD


def initial_query(seed: int, name: str, columns: int, rank: int) -> torch.Tensor:
    """Q before any step: drawn from the job's seed and the matrix's name (bucket key, then its index)."""
    return torch.randn(columns, rank, generator=torch.Generator().manual_seed(hash_seed(seed, name)))


def test_powersgd_step_by_hand():
    """2 ranks, a 6 x 5 matrix at rank 1 and a bias: P = M Q summed, P̂ its orthonormal basis, Q = M^T P̂ summed;
    every rank gets P̂ (sum of Q)^T and the bias's exact sum, and keeps M - P̂ P̂^T M as its error."""
    generator = torch.Generator().manual_seed(7)
    matrices = [torch.randn(6, 5, generator=generator) for _ in range(2)]
    biases = [torch.randn(5, generator=generator) for _ in range(2)]
    shapes = [torch.Size([6, 5]), torch.Size([5])]
    compressors = [PowerSGD(rank=1, seed=3) for _ in range(2)]
    contributions = [torch.cat([m.reshape(-1), b]) for m, b in zip(matrices, biases)]
    results = summed_on_ranks(lambda rank: compressors[rank], contributions, shapes, key="b")

    query = initial_query(3, "b.0", 5, 1)
    basis = torch.linalg.qr(matrices[0] @ query + matrices[1] @ query).Q
    local = [m.T @ basis for m in matrices]
    approximation = basis @ (local[0] + local[1]).T
    assert_same_bytes(results)
    torch.testing.assert_close(results[0][:30].view(6, 5), approximation, rtol=1e-6, atol=1e-6)
    assert torch.equal(results[0][30:], biases[0] + biases[1])  # the bias went exact
    for rank, compressor in enumerate(compressors):
        torch.testing.assert_close(compressor.errors["b.0"], matrices[rank] - basis @ basis.T @ matrices[rank],
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(compressor.queries["b.0"], local[0] + local[1], rtol=1e-6, atol=1e-6)  # warm start
    assert torch.equal(compressors[0].queries["b.0"], compressors[1].queries["b.0"])
    # nothing is lost: what was sent plus what the ranks kept back is the exact sum
    kept = compressors[0].errors["b.0"] + compressors[1].errors["b.0"]
    torch.testing.assert_close(results[0][:30].view(6, 5) + kept, matrices[0] + matrices[1], rtol=1e-5, atol=1e-5)


def test_powersgd_is_exact_on_matrices_of_rank_at_most_its_rank():
    generator = torch.Generator().manual_seed(1)
    # each rank's matrix has rank 1; their sum has rank 2 = the compression's rank
    matrices = [torch.outer(torch.randn(8, generator=generator), torch.randn(6, generator=generator))
                for _ in range(2)]
    compressors = [PowerSGD(rank=2) for _ in range(2)]
    results = summed_on_ranks(lambda rank: compressors[rank], [m.reshape(-1) for m in matrices], [torch.Size([8, 6])])
    assert compressors[0].compressible(torch.Size([8, 6]))
    assert_same_bytes(results)
    torch.testing.assert_close(results[0].view(8, 6), matrices[0] + matrices[1], rtol=1e-5, atol=1e-5)
    for compressor in compressors:
        assert compressor.errors["b.0"].abs().max() < 1e-5


def test_powersgd_compresses_only_where_it_pays():
    compressor = PowerSGD(rank=4)
    assert not compressor.compressible(torch.Size([64]))  # a bias
    assert not compressor.compressible(torch.Size([6, 5]))  # 4 x (6 + 5) = 44 numbers to send 30
    assert not compressor.compressible(torch.Size([8, 8]))  # 4 x 16 = 64: no saving
    assert not compressor.compressible(torch.Size([4, 100]))  # rank 4 of a 4-row matrix is all of it
    assert compressor.compressible(torch.Size([10, 10]))  # 80 numbers for 100
    assert compressor.compressible(torch.Size([16, 3, 3, 3]))  # a convolution: 16 x 27
    shapes = [torch.Size([64, 32]), torch.Size([32]), torch.Size([8, 8]), torch.Size([16, 3, 3, 3])]
    assert compressor.wire_numbers(shapes) == (4 * (64 + 32) + 32 + 64 + 4 * (16 + 27), 4)
    matrices, exact = compressor.layout(shapes)
    assert [(m.offset, m.rows, m.columns) for m in matrices] == [(0, 64, 32), (2144, 16, 27)]
    assert exact == [(2048, 32), (2080, 64)]


def test_powersgd_small_buckets_go_exact():
    contributions = [torch.arange(35.0), torch.ones(35)]
    results = summed_on_ranks(lambda rank: PowerSGD(rank=4), contributions, [torch.Size([5, 6]), torch.Size([5])])
    assert_same_bytes(results)
    assert torch.equal(results[0], torch.arange(35.0) + 1)


def powersgd_steps(compressors, gradients: list[torch.Tensor], steps: int, *, feedback: bool = True) -> list:
    """`steps` exchanges of each rank's same gradient (a matrix); what every rank received at each step."""

    def rank(comm):
        received = []
        for _ in range(steps):
            flat = gradients[comm.rank].reshape(-1).clone()
            compressors[comm.rank].sum_(flat, [gradients[comm.rank].shape], "w", comm)
            if not feedback:
                compressors[comm.rank].forget_errors()
            received.append(flat.view_as(gradients[comm.rank]))
        return received

    return run_ranks(len(gradients), rank, timeout=20)


def relative_gaps(received: list[torch.Tensor], truth: torch.Tensor) -> list[float]:
    """After each step: how far the running sum of what was received is from the running sum of the truth."""
    gaps, running = [], torch.zeros_like(truth)
    for step, result in enumerate(received, start=1):
        running += result
        gaps.append(((running - step * truth).norm() / (step * truth).norm()).item())
    return gaps


def test_powersgd_error_feedback_delivers_the_gradients_over_time():
    """What a step leaves out goes out in later steps: the running sum of what was sent approaches the running
    sum of the gradients (the gap shrinks as 1/steps); without feedback the same rank-2 part goes every time."""
    generator = torch.Generator().manual_seed(11)
    gradients = [torch.randn(8, 6, generator=generator) for _ in range(2)]
    truth = gradients[0] + gradients[1]
    with_feedback = powersgd_steps([PowerSGD(rank=2) for _ in range(2)], gradients, 100)
    without = powersgd_steps([PowerSGD(rank=2) for _ in range(2)], gradients, 50, feedback=False)
    for received in (with_feedback, without):
        assert all(torch.equal(a, b) for a, b in zip(received[0], received[1]))  # every step, every rank
    gaps = relative_gaps(with_feedback[0], truth)
    assert gaps[0] > 0.5  # one step of rank 2 on a random 8 x 6 matrix leaves much of it out
    assert gaps[49] < 0.05 and gaps[99] < gaps[49] / 1.5
    assert min(relative_gaps(without[0], truth)) > 0.4


def test_powersgd_ranks_hold_the_same_queries():
    generator = torch.Generator().manual_seed(5)
    gradients = [torch.randn(16, 12, generator=generator) for _ in range(3)]
    compressors = [PowerSGD(rank=2, seed=9) for _ in range(3)]
    received = powersgd_steps(compressors, gradients, 3)
    for rank in (1, 2):
        assert all(torch.equal(a, b) for a, b in zip(received[0], received[rank]))
        assert torch.equal(compressors[rank].queries["w.0"], compressors[0].queries["w.0"])
        assert not torch.equal(compressors[rank].errors["w.0"], compressors[0].errors["w.0"])  # each its own
    assert compressors[0].queries["w.0"].shape == (12, 2)


def test_powersgd_state_round_trip_continues_bit_for_bit():
    generator = torch.Generator().manual_seed(2)
    gradients = [torch.randn(16, 12, generator=generator) for _ in range(2)]
    later = [torch.randn(16, 12, generator=generator) for _ in range(2)]
    running = [PowerSGD(rank=2, seed=4) for _ in range(2)]
    powersgd_steps(running, gradients, 3)
    saved = [compressor.state_dict() for compressor in running]
    assert set(saved[0]) == {"queries", "errors"} and set(saved[0]["errors"]) == {"w.0"}
    continued = powersgd_steps(running, later, 3)
    resumed = [PowerSGD(rank=2, seed=4) for _ in range(2)]
    for compressor, state in zip(resumed, saved):
        compressor.load_state_dict(state)
    again = powersgd_steps(resumed, later, 3)
    for rank in range(2):
        assert all(torch.equal(a, b) for a, b in zip(continued[rank], again[rank]))
        assert torch.equal(resumed[rank].queries["w.0"], running[rank].queries["w.0"])
        assert torch.equal(resumed[rank].errors["w.0"], running[rank].errors["w.0"])
    fresh = powersgd_steps([PowerSGD(rank=2, seed=4) for _ in range(2)], later, 1)
    assert not torch.equal(fresh[0][0], again[0][0])  # the state mattered


def test_forget_errors_keeps_the_queries():
    generator = torch.Generator().manual_seed(3)
    compressors = [PowerSGD(rank=1) for _ in range(2)]
    powersgd_steps(compressors, [torch.randn(16, 12, generator=generator) for _ in range(2)], 2)
    queries = compressors[0].queries["w.0"].clone()
    assert compressors[0].errors["w.0"].abs().max() > 0
    compressors[0].forget_errors()
    assert compressors[0].errors == {}
    assert torch.equal(compressors[0].queries["w.0"], queries)
    assert compressors[0].state_dict()["errors"] == {}


@pytest.mark.parametrize("rank", [0, -1, True, 2.0, "4"])
def test_bad_compression_rank_names_the_key(rank):
    with pytest.raises(ConfigError, match=r"^algorithm\.compression_rank: "):
        PowerSGD(rank)
    with pytest.raises(ConfigError, match=r"^algorithm\.compression_rank: "):
        make_compressor("powersgd", rank)


def test_make_compressor_names_each_compression():
    assert type(make_compressor("none")) is Exact
    assert make_compressor("bf16").dtype == torch.bfloat16 and make_compressor("fp16").dtype == torch.float16
    powersgd = make_compressor("powersgd", 3, seed=8)
    assert (powersgd.rank, powersgd.seed) == (3, 8)
    with pytest.raises(ConfigError, match=r"^algorithm\.compression: unknown compression 'topk'"):
        make_compressor("topk")
