"""The straight line a link's measured points are priced by (shoal.plan.network_probe.fit), on hand-made points."""

from __future__ import annotations

import pytest

from shoal.plan.network_probe import fit
from shoal.plan.render import link_text


def one_message(size: int) -> tuple[int, int]:
    return 1, size


def test_points_on_a_line_give_its_fixed_cost_and_bandwidth():
    points = {size: 50e-6 + size / 125e6 for size in (4096, 65536, 1_000_000)}  # 50 us, 1 Gbit/s
    link = fit(points, one_message)
    assert link.latency == pytest.approx(50e-6)
    assert link.bandwidth == pytest.approx(125e6)
    assert [size for size, _ in link.points] == [4096, 65536, 1_000_000]


def test_a_fixed_cost_below_zero_is_refitted_through_the_origin():
    link = fit({1000: 1e-6, 2000: 3e-6}, one_message)  # the line through both crosses at -1 us
    assert link.latency == 0.0
    assert link.bandwidth == pytest.approx((1000**2 + 2000**2) / (1000 * 1e-6 + 2000 * 3e-6))


def test_a_cost_that_does_not_grow_with_size_gives_the_bandwidth_the_largest_message_showed():
    # loopback on a busy 2-core machine: the larger message came back no slower than the smaller
    link = fit({65536: 1.9e-3, 262144: 1.8e-3}, one_message)
    assert link.bandwidth == pytest.approx(262144 / 1.8e-3)
    assert link.seconds(262144) == pytest.approx(1.8e-3)  # measured points are still priced as measured
    assert link.seconds(2 * 262144) == pytest.approx(2 * 1.8e-3)  # beyond them, that bandwidth adds
    assert "1,165.1 Mbit/s" in link_text(link)
