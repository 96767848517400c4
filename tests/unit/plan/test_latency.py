"""Each exchange priced as its messages x the link's latency plus its bytes over the link's rate, by hand; one
machine recommended where the messages' latency outweighs what more machines save."""

from __future__ import annotations

import pytest

from shoal.bucket_rules import MEGABYTE
from shoal.plan.calibrate import described_network
from shoal.plan.costs import Link
from shoal.plan.planner import make_plan
from shoal.plan.predict import Layout, Shape, predict
from shoal.plan.profile import Compute, Network, Profile
from shoal.plan.render import render

LATENCY, RATE = 1e-3, 1e6  # seconds per message, bytes per second
NETWORK = Network(across=Link(LATENCY, RATE, points=((2048, 3e-3), (8192, 9e-3))), inside=Link(1e-5, 1e9),
                  source="test")
TWO_LAYERS = ((1024,), (1024,))  # 4 kB of gradients each


def compute(step: float = 0.01, parameters: int = 2048) -> Compute:
    return Compute(model="m", parameters=parameters, threads=1, step_seconds={100: step}, update_seconds=0.0,
                   copy_seconds_per_byte=0.0, evaluate_seconds_per_row=1e-6, load_rows_per_second=1e6,
                   startup_seconds=1.0)


def shape(algorithm: str, options: dict | None = None, rows: int = 10_000, parameters: int = 2048) -> Shape:
    return Shape(parameters=parameters, buffers=0, rows=rows, test_rows=0, batch=100, epochs=1, eval_every=1,
                 algorithm=algorithm, options=options or {}, parameter_shapes=TWO_LAYERS if parameters == 2048 else ())


def test_each_sync_bucket_is_one_all_reduce_of_messages_and_bytes():
    """Buckets of 4 kB: two of them, each a 2-rank ring of 2 messages of 2 kB; the link's points are not used."""
    found = predict(shape("sync", {"bucket_mb": 4096 / MEGABYTE}), Layout(2, 1), compute(), NETWORK)
    per_step = 2 * (2 * LATENCY + 2 * 2048 / RATE)  # 4 messages, 8 kB sent
    assert found.steps == 50
    assert found.communication_seconds == pytest.approx(50 * per_step)
    bf16 = predict(shape("sync", {"compression": "bf16"}), Layout(2, 1), compute(), NETWORK)
    # half precision: one bucket of 4 kB as sent, and the row count (8 bytes) in a collective of its own
    assert bf16.communication_seconds == pytest.approx(50 * (2 * (LATENCY + 2048 / RATE) + 2 * (LATENCY + 4 / RATE)))


def test_an_averaging_round_is_a_ring_of_the_weights_every_period():
    found = predict(shape("averaging", {"period": 5}), Layout(4, 1), compute(), NETWORK)
    ring = 6 * (LATENCY + 8192 / 4 / RATE)  # 2 (N-1) messages of a quarter of the 8 kB weights
    assert found.steps == 25
    assert found.communication_seconds == pytest.approx(5 * ring)


def test_a_downpour_exchange_is_a_round_trip_of_two_messages():
    """One trainer, so no queue: each step its update and the server's reply, a header each beside the 8 kB."""
    found = predict(shape("downpour"), Layout(2, 1), compute(), NETWORK)
    message = 2048 * 4 + 64
    assert (found.trainers, found.steps) == (1, 100)
    assert found.communication_seconds == pytest.approx(100 * (2 * LATENCY + 2 * message / RATE))


def test_one_machine_is_recommended_where_each_steps_messages_outweigh_its_compute():
    """A tiny model: 1 ms of compute a step, 2 ms of messages a step on the link (a 2-rank all-reduce is 2 of
    1 ms each), its bytes next to nothing, with sync or averaging every step. However many rows, more machines
    lose. (A parameter server's trainers wait on the link side by side, not in turn: they are priced apart.)"""
    tiny = compute(step=0.001, parameters=1000)
    network = Network(across=Link(1e-3, 1.25e8), inside=Link(1e-5, 1e9), source="test")
    shapes = [shape("sync", rows=1_000_000, parameters=1000),
              shape("averaging", {"period": 1}, rows=1_000_000, parameters=1000)]
    profile = Profile(compute=tiny, network=network)
    plan = make_plan(shapes, [1, 2, 4, 8], 1, profile)
    assert plan.one_machine is not None and plan.one_machine.nodes == 1
    assert plan.recommendation.startswith("one machine: 1 node(s) x 1 worker(s)"), plan.recommendation
    assert "no layout of more machines is 1.2x as fast (the fastest, " in plan.recommendation
    assert "recommended: one machine: " in render(plan, profile, 1)
    # asked only for several machines, the plan still compares them with one
    assert make_plan(shapes, [2, 4], 1, profile).recommendation.startswith("one machine: 1 node(s)")
    # on a link a thousand times quicker to answer, several machines pay
    quick = Profile(compute=tiny, network=Network(across=Link(1e-6, 1.25e8), inside=Link(1e-5, 1e9), source="t"))
    assert not make_plan(shapes, [1, 2, 4, 8], 1, quick).recommendation.startswith("one machine")


def test_a_described_link_keeps_the_probed_latency_or_assumes_one_and_says_which():
    probed = described_network("1gbit", None, probed=Link(2e-3, 5e7, points=((4096, 2.1e-3),)))
    assert probed.across.latency == pytest.approx(2e-3)
    assert "2 ms per message as probed" in probed.source
    assumed = described_network("1gbit")
    assert assumed.across.latency == pytest.approx(1e-4)
    assert "0.1 ms per message assumed (--latency sets it)" in assumed.source
    given = described_network("1gbit", "0", probed=Link(2e-3, 5e7))
    assert given.across.latency == 0.0 and "per message given" in given.source
