"""Plans on machines of different speeds: the epoch with equal shares and with speed shares against the sums done
by hand, `--machines`' classes, and the table that shows both."""

from __future__ import annotations

import dataclasses
import json

import pytest

from shoal.errors import ConfigError
from shoal.plan.command import planned_counts
from shoal.plan.machines import check_models, machine_counts, machine_speeds, parse_machines
from shoal.plan.planner import make_plan
from shoal.plan.predict import EVALUATION_COLD, Layout, predict, slowest_pace
from shoal.plan.profile import Profile
from shoal.plan.render import machines_text, render
from tests.unit.plan.test_predict import ACROSS, INSIDE, NETWORK, compute, shape

ROWS = 3000
RATE = 100 / 0.01  # rows per second of the profile's worker: batch 100 in a 0.01 s step


def both(algorithm: str, layout: Layout, **changes):
    """(equal shares, speed shares) predictions of a 3000-row job."""
    job = shape(algorithm, rows=ROWS, **changes)
    return (predict(job, layout, compute(), NETWORK),
            predict(dataclasses.replace(job, balance="speed"), layout, compute(), NETWORK))


@pytest.mark.parametrize("algorithm", ["sync", "averaging"])
def test_equal_shares_go_at_the_slowest_machine_and_speed_shares_at_the_sum_of_the_rates(algorithm):
    """Machines of speeds 1, 0.5 and 0.5, one worker each: 10 steps of 100 rows each per trainer."""
    equal, balanced = both(algorithm, Layout(3, 1, (1.0, 0.5, 0.5)))
    even = predict(shape(algorithm, rows=ROWS), Layout(3, 1), compute(), NETWORK)
    assert equal.steps == balanced.steps == 10
    assert equal.compute_seconds == pytest.approx((ROWS / 3) / (0.5 * RATE))  # 0.2 s
    assert balanced.compute_seconds == pytest.approx(ROWS / ((1.0 + 0.5 + 0.5) * RATE))  # 0.15 s
    for found in (equal, balanced):  # the communication as on even machines
        assert found.communication_seconds == pytest.approx(even.communication_seconds)
        assert found.epoch_seconds == pytest.approx(found.compute_seconds + even.communication_seconds)
    assert (equal.balance, balanced.balance, even.balance) == ("equal", "speed", None)
    assert (equal.label, balanced.label, even.label) == (
        f"{algorithm}, equal shares", f"{algorithm}, speed shares", algorithm)


def test_machines_of_one_speed_share_alike_and_their_speed_replaces_the_probed_slowest_host():
    slower = dataclasses.replace(NETWORK, slowest_host=1.3)
    job = shape("sync", rows=ROWS)
    even = predict(job, Layout(2, 1), compute(), NETWORK)
    assert predict(job, Layout(2, 1), compute(), slower).compute_seconds == pytest.approx(even.compute_seconds * 1.3)
    for balance in ("equal", "speed"):
        given = predict(dataclasses.replace(job, balance=balance), Layout(2, 1, (1.0, 1.0)), compute(), slower)
        assert given.epoch_seconds == pytest.approx(even.epoch_seconds)
    faster = predict(job, Layout(2, 1, (2.0, 2.0)), compute(), NETWORK)  # twice the profile's machine
    assert faster.compute_seconds == pytest.approx(even.compute_seconds / 2)


def test_a_machines_workers_share_its_speed_and_a_server_on_the_first_machine_is_left_out():
    """Downpour on machines of speeds 0.25 and 1, two workers each: rank 0 (the server) on the slow machine,
    so the trainers run at 0.25, 1 and 1: equal shares go at 0.25, speed shares at 3 / 2.25."""
    layout = Layout(2, 2, (0.25, 1.0))
    assert layout.worker_speeds() == [0.25, 0.25, 1.0, 1.0]
    job = shape("downpour", rows=ROWS)
    for balance, pace in (("equal", 4.0), ("speed", 3 / 2.25)):
        found = predict(dataclasses.replace(job, balance=balance), layout, compute(), NETWORK)
        slow = compute(step_seconds={batch: seconds * pace for batch, seconds in compute().step_seconds.items()})
        expected = predict(job, Layout(2, 2), slow, NETWORK)
        assert found.trainers == 3
        assert found.compute_seconds == pytest.approx(expected.compute_seconds)
        assert found.epoch_seconds == pytest.approx(expected.epoch_seconds)
        # rank 0 evaluates, on the machine a quarter as fast
        assert found.evaluation_seconds == pytest.approx(1000 * 1e-5 * EVALUATION_COLD / 0.25)


def test_a_machines_pace_that_moves_comes_on_top_of_its_speed():
    moving = compute(pace_range=1.5)
    job = shape("averaging", rows=ROWS)
    found = predict(job, Layout(2, 1, (1.0, 0.5)), moving, NETWORK)
    assert found.compute_seconds == pytest.approx(15 * 0.01 * 2 * slowest_pace(1.5, 2))


def test_a_layout_needs_a_speed_above_zero_for_each_machine():
    with pytest.raises(ValueError):
        Layout(3, 1, (1.0, 0.5))
    with pytest.raises(ValueError):
        Layout(2, 1, (1.0, 0.0))


def test_a_plan_on_uneven_machines_shows_both_shares_and_recommends_speed_shares():
    """Speeds 1, 0.5, 0.5 and a compute-bound job: the third machine slows equal shares' compute from rows / r
    (2 nodes, the slower at half pace) to 2/3 rows / r, and speeds speed shares' to rows / 2r."""
    profile = Profile(machine={"host": "test"}, compute=compute(), network=NETWORK)
    job = shape("averaging", rows=1_000_000)
    plan = make_plan([job], [1, 2, 3], 1, profile, (1.0, 0.5, 0.5))
    assert [(p.nodes, p.balance) for p in plan.predictions] == [
        (1, "equal"), (1, "speed"), (2, "equal"), (2, "speed"), (3, "equal"), (3, "speed")]
    compute_seconds = {(p.nodes, p.balance): p.compute_seconds for p in plan.predictions}
    rows_over_rate = 1_000_000 / RATE
    assert compute_seconds[(2, "equal")] == pytest.approx(rows_over_rate, rel=1e-3)
    assert compute_seconds[(3, "equal")] == pytest.approx(rows_over_rate * 2 / 3, rel=1e-3)
    assert compute_seconds[(2, "speed")] == pytest.approx(rows_over_rate / 1.5, rel=1e-3)
    assert compute_seconds[(3, "speed")] == pytest.approx(rows_over_rate / 2, rel=1e-3)
    assert set(plan.crossovers) == {"averaging, equal shares", "averaging, speed shares"}
    assert plan.baseline["averaging, speed shares"] == plan.predictions[1].job_seconds
    assert plan.recommendation.startswith(
        '3 node(s) x 1 worker(s), averaging with speed shares (cluster.balance = "speed"), batch 100: '), \
        plan.recommendation
    assert json.loads(json.dumps(plan.to_dict()))["machine_speeds"] == [1.0, 0.5, 0.5]

    text = render(plan, profile, 1)
    assert "machines: 1 x 1.00, 2 x 0.50 (each one's speed against the profile's machine" in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("nodes"))
    assert header.split() == ["nodes", "workers", "algorithm", "shares", "epoch", "job", "speedup", "efficiency",
                              "comm.", "staleness"]
    assert [line.split()[3] for line in lines[lines.index(header) + 1:lines.index(header) + 7]] == [
        "equal", "speed"] * 3
    assert "  averaging, speed shares: faster than one machine from 2 machines on (" in text


def test_even_machines_plan_as_before():
    profile = Profile(machine={"host": "test"}, compute=compute(), network=NETWORK)
    plan = make_plan([shape("sync")], [1, 2], 1, profile)
    assert [p.balance for p in plan.predictions] == [None, None] and set(plan.crossovers) == {"sync"}
    text = render(plan, profile, 1)
    assert "shares" not in text and "machines:" not in text


# ---------------------------------------------------------------- --machines


def test_classes_of_given_speeds():
    classes = parse_machines("2x1.0, 1x0.5")
    assert [(c.count, c.speed, c.path) for c in classes] == [(2, 1.0, None), (1, 0.5, None)]
    assert machine_speeds(classes, compute(), 100) == (1.0, 1.0, 0.5)
    assert machines_text((1.0, 1.0, 0.5, 1.0)) == "2 x 1.00, 1 x 0.50, 1 x 1.00"


def test_a_class_profile_gives_its_speed_from_its_step_at_the_jobs_batch(tmp_path):
    Profile(compute=compute(step_seconds={100: 0.04, 200: 0.08}), network=NETWORK).save(tmp_path / "slow.json")
    classes = parse_machines(f"2x1,1x{tmp_path / 'slow.json'}")
    assert classes[1].path == tmp_path / "slow.json" and classes[1].compute.step(100) == 0.04
    assert machine_speeds(classes, compute(), 100) == (1.0, 1.0, pytest.approx(0.25))
    check_models(classes, "m")
    with pytest.raises(ConfigError, match=r"slow.json: compute.model: measured on another model"):
        check_models(classes, "another")


@pytest.mark.parametrize("text, message", [
    ("2x0", "--machines: '2x0': a speed must be a number > 0"),
    ("2x-1", "--machines: '2x-1': a speed must be a number > 0"),
    ("2xnan", "--machines: '2xnan': a speed must be a number > 0"),
    ("0x1", "--machines: expected COUNTxSPEED or COUNTxPROFILE"),
    ("x1", "--machines: expected COUNTxSPEED or COUNTxPROFILE"),
    ("2x1,", "--machines: expected COUNTxSPEED or COUNTxPROFILE"),
    ("20000x1", "--machines: at most 10,000 machines, got 20,000"),
    ("1xmissing.json", "missing.json: no such profile"),
])
def test_bad_classes_are_one_line(text, message):
    with pytest.raises(ConfigError) as caught:
        parse_machines(text)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_class_profile_without_compute_is_refused(tmp_path):
    Profile(network=NETWORK).save(tmp_path / "network.json")
    with pytest.raises(ConfigError, match="network.json: no compute in it"):
        parse_machines(f"1x{tmp_path / 'network.json'}")


def test_node_counts_on_listed_machines():
    assert machine_counts(parse_machines("2x1.0,1x0.5")) == [1, 2, 3]
    assert machine_counts(parse_machines("16x1,16x0.5")) == [1, 2, 4, 8, 16, 32]
    assert machine_counts(parse_machines("3x1,2x0.7")) == [1, 2, 3, 4, 5]
    classes = parse_machines("2x1.0,1x0.5")
    assert planned_counts(None, None, classes) == [1, 2, 3]
    assert planned_counts("1,3", None, classes) == [1, 3]
    assert planned_counts(None, ["a", "b", "c"], classes) == [1, 2, 3]
    assert planned_counts(None, None, []) == [1, 2, 4, 8, 16]
    with pytest.raises(ConfigError, match="--nodes: 4 nodes, but --machines lists 3"):
        planned_counts("2,4", None, classes)
    with pytest.raises(ConfigError, match=r"--machines: lists 3 machine\(s\) for 2 --hosts"):
        planned_counts(None, ["a", "b"], classes)


def test_a_described_network_is_kept_for_machines_of_given_speeds():
    """The speeds change the compute alone: the links stay as described."""
    slow_link = dataclasses.replace(NETWORK, across=dataclasses.replace(ACROSS, latency=1e-2), inside=INSIDE)
    equal, _ = both("sync", Layout(3, 1, (1.0, 0.5, 0.5)))
    found = predict(shape("sync", rows=ROWS), Layout(3, 1, (1.0, 0.5, 0.5)), compute(), slow_link)
    assert found.compute_seconds == pytest.approx(equal.compute_seconds)
    assert found.communication_seconds > equal.communication_seconds


def test_machine_groups_are_one_group_per_node():
    """cluster.groups = "machine": averaging within each machine every group period, as a count of the nodes."""
    for nodes in (2, 3):
        by_machine = predict(shape("averaging", groups="machine", options={"group_period": 5}), Layout(nodes, 2),
                             compute(), NETWORK)
        counted = predict(shape("averaging", groups=nodes, options={"group_period": 5}), Layout(nodes, 2),
                          compute(), NETWORK)
        assert by_machine.epoch_seconds == pytest.approx(counted.epoch_seconds)
    profile = Profile(machine={"host": "test"}, compute=compute(), network=NETWORK)
    plan = make_plan([shape("averaging", groups="machine", options={"group_period": 5})], [1, 2], 2, profile)
    assert [p.nodes for p in plan.predictions] == [1, 2]
