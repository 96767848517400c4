"""The cost model's arithmetic against cases computed by hand."""

from __future__ import annotations

import pytest

from shoal.plan.costs import Line, Link, closed_queue, crossover, hierarchical_all_reduce, ring_all_reduce


def test_a_link_charges_latency_plus_bytes_over_bandwidth():
    link = Link(latency=1e-4, bandwidth=125e6)  # 1 Gbit/s
    assert link.seconds(125_000) == pytest.approx(1e-4 + 1e-3)


def test_a_measured_link_is_priced_by_its_line_not_its_points():
    link = Link(latency=1e-3, bandwidth=1e6, points=((1000, 0.002), (3000, 0.004)))
    assert link.seconds(500) == pytest.approx(1e-3 + 500 / 1e6)
    assert link.seconds(2000) == pytest.approx(1e-3 + 2000 / 1e6)
    assert link.measured and not Link(1e-3, 1e6).measured


def test_a_format_2_link_interpolates_its_points_and_adds_bandwidth_beyond_them():
    link = Link(latency=0.0, bandwidth=1e6, points=((1000, 0.002), (3000, 0.004)), interpolated=True)
    assert link.seconds(500) == 0.002  # below the smallest point: the smallest point's time
    assert link.seconds(2000) == pytest.approx(0.003)
    assert link.seconds(5000) == pytest.approx(0.004 + 2000 / 1e6)


def test_a_ring_all_reduce_is_two_n_minus_one_rounds_of_one_nth():
    exchange = ring_all_reduce(1_000_000, 4)
    assert (exchange.rounds, exchange.size) == (6, 250_000)
    assert exchange.bytes_sent == 1_500_000  # 2 (N-1)/N of the buffer
    assert exchange.seconds(Link(latency=1e-3, bandwidth=1e8)) == pytest.approx(6 * (1e-3 + 2.5e-3))
    assert ring_all_reduce(1000, 1).rounds == 0


def test_a_ring_across_machines_runs_at_the_slowest_hop():
    inside, across = Link(1e-5, 1e10), Link(1e-3, 1e7)
    assert hierarchical_all_reduce(8e6, 2, 4, inside, across) == pytest.approx(14 * (1e-3 + 1e6 / 1e7))
    assert hierarchical_all_reduce(8e6, 1, 4, inside, across) == pytest.approx(6 * (1e-5 + 2e6 / 1e10))


def test_one_client_of_a_server_waits_for_its_service_alone():
    queue = closed_queue([0.002, 0.001], think=0.007, clients=1)
    assert queue.cycle == pytest.approx(0.010)
    assert queue.throughput == pytest.approx(100.0)


def test_a_saturated_server_serves_at_its_own_rate():
    # 2 clients that think 1 ms, a server needing 10 ms: mean value analysis by hand.
    # n=1: R=10, X=1/11, Q=10/11. n=2: R=10(1+10/11)=210/11, X=2/(1+210/11)=22/221
    queue = closed_queue([0.010], think=0.001, clients=2)
    assert queue.throughput == pytest.approx(22 / 221 * 1e3)
    assert queue.cycle == pytest.approx(0.001 + 0.210 / 11)
    assert closed_queue([0.010], think=0.001, clients=50).throughput == pytest.approx(100.0, rel=1e-6)


def test_two_lines_cross_where_fixed_and_per_row_costs_balance():
    one = Line(fixed=20.0, per_row=1e-3)
    two = Line(fixed=30.0, per_row=0.5e-3)
    assert crossover(one, two) == pytest.approx(20_000)
    assert one.at(20_000) == pytest.approx(two.at(20_000))
    assert crossover(one, Line(30.0, 2e-3)) is None  # slower per row and dearer to start: never
    assert crossover(one, Line(10.0, 0.5e-3)) == 0.0  # cheaper in both: always
