"""The straight line a link's measured points are priced by (shoal.plan.network_probe.fit), on hand-made points,
and a link known only by its nominal rate."""

from __future__ import annotations

import math

import pytest

from shoal.plan.calibrate import described_network, reached_share
from shoal.plan.network_probe import fit, links, probe_sizes
from shoal.plan.render import link_text


def one_message(size: int) -> tuple[int, int]:
    return 1, size


def test_points_on_a_line_give_its_fixed_cost_and_bandwidth():
    points = {size: 50e-6 + size / 125e6 for size in (4096, 65536, 1_000_000)}  # 50 us, 1 Gbit/s
    link = fit(points, one_message)
    assert link.latency == pytest.approx(50e-6)
    assert link.bandwidth == pytest.approx(125e6)
    assert [size for size, _ in link.points] == [4096, 65536, 1_000_000]


def test_probed_all_reduces_and_round_trips_give_each_messages_latency_and_the_rate_reached():
    """As the probe reports them: a 2-rank all-reduce of B bytes is 2 messages of B/2 (2 ms at 4 kB: 1 ms each,
    a slow wake-up's), a message half a round trip; sizes from a small one to twice the model's."""
    sizes = probe_sizes(127_240)
    assert sizes[0] == 4096 and sizes[-1] == 2 * 127_240 and len(sizes) >= 2
    latency, rate = 1e-3, 55e6  # 1 Gbit/s, 55% of it reached
    results = {"loaded_all_reduce": {str(size): 2 * (latency + size / 2 / rate) for size in sizes},
               "loaded_message": {str(size): 0.4e-3 + size / 90e6 for size in sizes}, "pace": 1.0}
    ring, message = links(results)
    assert ring.latency == pytest.approx(latency) and ring.bandwidth == pytest.approx(rate)
    assert message.latency == pytest.approx(0.4e-3) and message.bandwidth == pytest.approx(90e6)
    assert ring.seconds(10_000) == pytest.approx(latency + 10_000 / rate)


def test_noisy_times_are_fitted_by_least_squares():
    noise = {4096: 1e-5, 65536: -2e-5, 262144: 1.5e-5, 1_000_000: -0.5e-5}
    link = fit({size: 2e-3 + size / 1e8 + noise[size] for size in noise}, one_message)
    assert link.latency == pytest.approx(2e-3, rel=0.02) and link.bandwidth == pytest.approx(1e8, rel=0.02)


def test_a_fixed_cost_below_zero_is_refitted_through_the_origin():
    link = fit({1000: 1e-6, 2000: 3e-6}, one_message)  # the line through both crosses at -1 us
    assert link.latency == 0.0
    assert link.bandwidth == pytest.approx((1000**2 + 2000**2) / (1000 * 1e-6 + 2000 * 3e-6))


def test_a_cost_that_does_not_grow_with_size_gives_the_bandwidth_the_largest_message_showed():
    # loopback on a busy 2-core machine: the larger message came back no slower than the smaller
    link = fit({65536: 1.9e-3, 262144: 1.8e-3}, one_message)
    assert link.bandwidth == pytest.approx(262144 / 1.8e-3)
    # the fixed cost is the least-squares one beside that bandwidth: what it leaves of 1.9 ms and 0 ms, averaged
    assert link.latency == pytest.approx((1.9e-3 - 65536 / link.bandwidth) / 2)
    assert link.seconds(262144) == pytest.approx(link.latency + 1.8e-3)  # priced by the line, not the points
    assert "1,165.1 Mbit/s" in link_text(link)


def test_a_link_given_by_its_nominal_rate_is_priced_at_the_share_shoals_exchange_reached():
    """100 Mbit/s is 12.5 MB/s on the wire; shoal's all-reduces reached 70% of it on the emulated link. Between the
    measured rates the share goes in log rate (300 Mbit/s: 0.477 of the way from 100 to 1000), and beyond them
    stays the nearest one's."""
    link = described_network("100mbit", "0.1ms").across
    assert link.latency == pytest.approx(1e-4)
    assert link.bandwidth == pytest.approx(12.5e6 * 0.70)
    assert link.seconds(63_620) == pytest.approx(1e-4 + 63_620 / 8.75e6)
    assert reached_share(300e6) == pytest.approx(0.70 + math.log10(3) * (0.55 - 0.70))
    assert reached_share(10e9) == 0.55 and reached_share(1e6) == 0.80
    assert "priced at 70% of the rate" in described_network("100mbit", "0.1ms").source
    assert "70.0 Mbit/s" in link_text(link)
