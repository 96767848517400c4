"""Sync's exchange as the plan prices it: buckets, each compression's bytes and what overlap hides, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from shoal.algorithms.compression import PowerSGD, make_compressor
from shoal.algorithms.exchange import make_buckets
from shoal.bucket_rules import bucket_bytes
from shoal.errors import ConfigError
from shoal.plan.costs import Link
from shoal.plan.exchange import (
    BACKWARD_SHARE,
    StepExchange,
    SyncOptions,
    Topology,
    buckets,
    capacity,
    factored,
    payloads,
    step_exchange,
)
from shoal.plan.predict import Layout, Shape, predict
from shoal.plan.profile import Compute, Network

PERCEPTRON = ((40, 784), (40,), (10, 40), (10,))  # the digits example's 784-40-10: 31,810 parameters
MLP = ((2048, 784), (2048,), (512, 2048), (512,), (10, 512), (10,))  # the 784-2048-512-10: 2,661,898
ACROSS = Link(latency=1e-3, bandwidth=1e6)
INSIDE = Link(latency=1e-5, bandwidth=1e9)


def count(shapes) -> int:
    return sum(math.prod(shape) for shape in shapes)


def options(**values) -> SyncOptions:
    """The job's options; overlapped unless they say otherwise (the algorithm's "auto" is priced as off)."""
    return SyncOptions.of({"overlap": True, **values})


def test_each_compression_sends_its_bytes_for_the_perceptron():
    (bucket,) = buckets(count(PERCEPTRON), PERCEPTRON, options())  # 127 kB: under the smallest bucket, 256 KiB
    assert payloads(bucket, options()) == [31_810 * 4]
    assert payloads(bucket, options(compression="bf16")) == [31_810 * 2]
    assert payloads(bucket, options(compression="fp16")) == [31_810 * 2]
    # rank 4: P of 40 x 4 and 10 x 4 with the 50 biases exact in the first all-reduce, Q of 784 x 4 and 40 x 4 next
    assert payloads(bucket, options(compression="powersgd")) == [(160 + 40 + 50) * 4, (3136 + 160) * 4]
    assert payloads(bucket, options(compression="powersgd", compression_rank=1)) == [(40 + 10 + 50) * 4,
                                                                                     (784 + 40) * 4]


def test_powersgd_factors_only_the_matrices_where_it_pays():
    assert factored((40, 784), 4) == (40, 784)
    assert factored((64, 3, 3, 3), 4) == (64, 27)  # a convolution: its first dimension by the rest
    assert factored((40,), 4) is None  # a bias
    assert factored((4, 784), 4) is None  # min(n, m) must exceed the rank
    assert factored((6, 6), 4) is None  # 4 x (6 + 6) = 48 numbers would exceed its 36


def test_the_buckets_are_cut_as_the_algorithm_cuts_them():
    """The MLP's 10.6 MB: a bucket closes at an eighth of it (1.33 MB) in the backward pass's order: the last
    layers first, then 784 x 2048's 6.4 MB alone with its bias."""
    total = count(MLP) * 4
    assert capacity(count(MLP), options()) == total // 8 == bucket_bytes(total, None)
    cut = buckets(count(MLP), MLP, options())
    assert cut == [((10,), (10, 512), (512,), (512, 2048)), ((2048,), (2048, 784))]
    parameters = [torch.nn.Parameter(torch.empty(shape)) for shape in MLP]
    assert [[tuple(p.shape) for p in bucket.parameters] for bucket in make_buckets(parameters, total // 8)] == \
        [list(bucket) for bucket in cut]
    assert capacity(count(PERCEPTRON), options()) == bucket_bytes(count(PERCEPTRON) * 4, None) == 1 << 18
    assert capacity(count(MLP), options(bucket_mb=2)) == bucket_bytes(total, 2) == 2 << 20
    assert len(buckets(count(MLP), MLP, options(overlap=False))) == 1  # without overlap: one exchange after
    assert buckets(10, (), options(bucket_mb=16 / (1 << 20))) == [((4,),), ((3,),), ((3,),)]  # no shapes: even cuts


def test_the_bytes_match_what_the_compressors_put_on_the_wire():
    for name in ("none", "bf16", "powersgd"):
        compressor = make_compressor(name, 4)
        numbers, width = compressor.wire_numbers([torch.Size(shape) for shape in MLP])
        assert sum(payloads(MLP, options(compression=name))) == numbers * width
    powersgd = PowerSGD(4)
    assert all(powersgd.compressible(torch.Size(shape)) == (factored(shape, 4) is not None)
               for shape in (*MLP, *PERCEPTRON, (4, 784), (6, 6), (64, 3, 3, 3)))


def test_two_ranks_send_each_bucket_in_a_ring_all_reduce():
    """2 ranks on 1 MB/s with 1 ms a message: a ring all-reduce of B bytes is 2 messages of B/2."""
    found = step_exchange(count(PERCEPTRON), PERCEPTRON, options(), Topology(2, 1, ACROSS, INSIDE))
    assert found.early == pytest.approx(2 * (1e-3 + 4 / 1e6))  # the row count: 8 bytes
    assert found.seconds == found.last == pytest.approx(2 * (1e-3 + 31_810 * 2 / 1e6))
    assert found.bytes_sent == 8 + 31_810 * 4
    powersgd = step_exchange(count(PERCEPTRON), PERCEPTRON, options(compression="powersgd"),
                             Topology(2, 1, ACROSS, INSIDE), multiply_add=1e-9)
    assert powersgd.seconds == pytest.approx(2 * (1e-3 + 500 / 1e6) + 2 * (1e-3 + 6592 / 1e6))
    assert powersgd.bytes_sent == 8 + 250 * 4 + 3296 * 4
    # 4 n m r multiply-adds and a QR of n x r for each factored matrix
    assert powersgd.compute == pytest.approx((4 * 40 * 784 * 4 + 40 * 16 + 4 * 10 * 40 * 4 + 10 * 16) * 1e-9)
    half = step_exchange(count(PERCEPTRON), PERCEPTRON, options(compression="bf16"), Topology(2, 1, ACROSS, INSIDE),
                         copy_per_value=1e-9)
    assert half.compute == pytest.approx(2 * 31_810 * 1e-9)  # cast down and back up


def test_hierarchical_sums_within_the_machine_and_crosses_the_link_once_per_machine():
    """2 machines x 2 workers: 8 bytes then the bucket over loopback (2 messages of half), across 2 messages of half;
    flat, one ring of 4 ranks at the link's pace: 6 messages of a quarter."""
    size = 31_810 * 4
    topology = Topology(2, 2, ACROSS, INSIDE)
    found = step_exchange(count(PERCEPTRON), PERCEPTRON, options(), topology)
    assert found.last == pytest.approx(2 * INSIDE.seconds(size / 2) + 2 * ACROSS.seconds(size / 2))
    assert found.bytes_sent == 8 + size
    flat = step_exchange(count(PERCEPTRON), PERCEPTRON, options(hierarchical=False), topology)
    assert flat.last == pytest.approx(6 * ACROSS.seconds(size / 4))
    assert flat.bytes_sent == pytest.approx(1.5 * (8 + size))


def test_overlap_hides_all_but_the_last_bucket_behind_the_backward_pass():
    exchange = StepExchange(early=0.001, seconds=0.010, last=0.004, bytes_sent=0.0)
    assert exchange.exposed(backward=0.003, overlap=True) == pytest.approx(0.007 - 0.003 + 0.004)
    assert exchange.exposed(backward=0.020, overlap=True) == pytest.approx(0.004)  # only the last bucket shows
    assert exchange.exposed(backward=0.003, overlap=False) == pytest.approx(0.011)  # all of it after the pass
    assert exchange.exposed(backward=0.0, overlap=False) == pytest.approx(0.011)


def test_a_sync_epoch_waits_only_for_what_the_backward_pass_did_not_hide():
    """The MLP on 2 machines, 10 ms steps, `overlap = true`: backward 2/3 of a step. Its two buckets take
    2 x (1 ms + 4.2 MB / 2 / 1 MB/s)
    and 2 x (1 ms + 6.4 MB / 2 / 1 MB/s): only the first and the row count's hide, and only for 6.7 ms."""
    step = Compute(model="m", parameters=count(MLP), threads=1, step_seconds={100: 0.01}, update_seconds=0.0,
                   copy_seconds_per_byte=0.0, evaluate_seconds_per_row=0.0, load_rows_per_second=1e9,
                   startup_seconds=0.0)
    shape = Shape(parameters=count(MLP), buffers=0, rows=2000, test_rows=0, batch=100, epochs=1, eval_every=1,
                  algorithm="sync", options={"overlap": True}, parameter_shapes=MLP)
    network = Network(across=ACROSS, inside=INSIDE, source="test")
    first, last = 4_216_872, 6_430_720
    early, hidden, shown = 2 * (1e-3 + 4e-6), 2 * (1e-3 + first / 2e6), 2 * (1e-3 + last / 2e6)
    wait = early + hidden - BACKWARD_SHARE * 0.01 + shown
    found = predict(shape, Layout(2, 1), step, network)
    assert found.communication_seconds == pytest.approx(10 * wait)
    without = predict(Shape(**{**shape.__dict__, "options": {"overlap": False}}), Layout(2, 1), step, network)
    # one bucket after the pass, the row count riding in it
    assert without.communication_seconds == pytest.approx(10 * 2 * (1e-3 + (first + last) / 2e6))
    default = predict(Shape(**{**shape.__dict__, "options": {}}), Layout(2, 1), step, network)
    assert default.communication_seconds == without.communication_seconds  # "auto" is priced as a CPU worker's


def test_an_unknown_compression_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"^algorithm\.compression: expected one of none, bf16, fp16, powersgd"):
        SyncOptions.of({"compression": "zip"})
