"""Shares sized to speed (shoal.data.balance): the arithmetic every rank repeats to agree on who reads what.

Each property is checked over many generated cases: shares always sum to the rows, each is within a row
of its exact proportion unless the minimum lifts it, every row is in one worker's range and every
position of a share in one batch, and the equal plan is exactly the partition shoal always used.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shoal.data.balance import (
    RowShares,
    equal_plan,
    largest_remainder,
    nominal_crossed,
    nominal_steps,
    plan_from_shares,
    proportional,
    weighted_plan,
)
from shoal.data.partition import batch_bounds, share, steps_per_epoch
from shoal.errors import DataError

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
weight = st.floats(0.01, 100.0, allow_nan=False, allow_infinity=False)
weights_strategy = st.lists(weight, min_size=1, max_size=12)
integer_weights = st.lists(st.integers(1, 20), min_size=1, max_size=12)


def exact(rows: int, weights: list[float]) -> list[Fraction]:
    """Each worker's exact proportion of `rows`, in rationals (the floats' own values, no rounding)."""
    total = sum(Fraction(w) for w in weights)
    return [rows * Fraction(w) / total for w in weights]


# ---------------------------------------------------------------- rounding


@FAST
@given(rows=st.integers(0, 10_000), weights=weights_strategy)
def test_largest_remainder_sums_to_the_rows_and_rounds_each_share_by_less_than_a_row(rows, weights):
    parts = largest_remainder(rows, weights)
    assert sum(parts) == rows
    assert all(abs(part - value) < 1 for part, value in zip(parts, exact(rows, weights), strict=True))


@FAST
@given(rows=st.integers(1, 10_000), weights=weights_strategy)
def test_proportional_shares_are_the_rounded_proportions_when_the_minimum_does_not_bind(rows, weights):
    proportions = exact(rows, weights)
    assume(min(proportions) >= 1)
    shares = proportional(rows, weights)
    assert shares == largest_remainder(rows, weights)
    assert sum(shares) == rows
    assert all(abs(part - value) < 1 for part, value in zip(shares, proportions, strict=True))


@pytest.mark.parametrize(("rows", "weights", "expected"), [
    (3, [1, 1], [2, 1]),
    (5, [1, 1, 1], [2, 2, 1]),
    (6, [1, 1, 1, 1], [2, 2, 1, 1]),
    (7, [2, 1, 1], [3, 2, 2]),  # remainders .5 .75 .75: the two largest
    (5, [2, 1, 1], [3, 1, 1]),  # remainders .5 .25 .25: the largest
    (8, [1, 2, 1, 2], [1, 3, 1, 3]),  # remainders .33 .67 .33 .67: the tie between 1 and 3 gives both
    (7, [1, 2, 1, 2], [1, 3, 1, 2]),  # one row for two equal remainders: the lower index
    (3, [1] * 6, [1, 1, 1, 0, 0, 0]),
])
def test_ties_go_to_the_lower_index(rows, weights, expected):
    assert largest_remainder(rows, [float(w) for w in weights]) == expected


@FAST
@given(rows=st.integers(1, 5000), trainers=st.integers(1, 16))
def test_equal_weights_share_as_the_partition_does(rows, trainers):
    """Equal weights tie on every remainder: the first rows % trainers workers hold the extra row."""
    assume(rows >= trainers)
    expected = [stop - start for start, stop in (share(rows, trainers, rank) for rank in range(trainers))]
    assert proportional(rows, [1.0] * trainers) == expected
    assert proportional(rows, [2.5] * trainers) == expected


# ---------------------------------------------------------------- the minimum


@FAST
@given(rows=st.integers(1, 5000), weights=weights_strategy, minimum=st.integers(1, 50))
def test_the_minimum_only_takes_rows_from_workers_above_it(rows, weights, minimum):
    """Every share is at least the minimum; a share above it is within a row of its proportion of the rows the
    workers at the minimum leave, so no worker above the minimum holds a row too many against any other."""
    assume(rows >= minimum * len(weights))
    shares = proportional(rows, weights, minimum)
    assert sum(shares) == rows
    assert min(shares) >= minimum
    proportions = exact(rows, weights)
    for i, (mine, w_i) in enumerate(zip(shares, weights, strict=True)):
        if mine == minimum:
            continue
        assert mine < proportions[i] + 1  # lifting others to the minimum never gives a free worker more
        for theirs, w_j in zip(shares, weights, strict=True):
            # (mine - 1) / w_i < rate < (theirs + 1) / w_j: the rows of the rest go out at one rate
            assert (mine - 1) * Fraction(w_j) < (theirs + 1) * Fraction(w_i)


@pytest.mark.parametrize(("rows", "weights", "minimum", "expected"), [
    (10, [1, 1, 1000], 1, [1, 1, 8]),  # proportions 0.01: one row each, the fast worker the rest
    (100, [1, 1000], 5, [5, 95]),
    (100, [1, 3, 6], 20, [20, 27, 53]),  # 10 -> 20; the other 80 rows 3:6, 26.7 and 53.3
    (100, [1, 2, 17], 15, [15, 15, 70]),  # two below at once
    (100, [1, 4, 15], 20, [20, 20, 60]),  # 5 -> 20 leaves 80: then 16.8 falls below too
    (4, [1, 1, 1, 1], 1, [1, 1, 1, 1]),
])
def test_workers_below_the_minimum_get_it_and_the_others_share_the_rest(rows, weights, minimum, expected):
    assert proportional(rows, [float(w) for w in weights], minimum) == expected


@FAST
@given(rows=st.integers(1, 5000), weights=weights_strategy, batch_size=st.integers(2, 64))
def test_same_steps_shares_hold_at_least_a_row_a_step(rows, weights, batch_size):
    assume(rows >= len(weights))  # with a batch of 2 or more, as many rows as workers always suffice
    nominal = nominal_steps(rows, len(weights), batch_size)
    plan = weighted_plan(rows, weights, batch_size, same_steps=True)
    assert min(plan.shares) >= plan.nominal == nominal
    assert all(hi - lo >= 1 for worker in range(len(weights)) for lo, hi in plan.bounds(worker))


def test_a_very_slow_worker_of_a_same_steps_plan_gets_one_row_a_step():
    plan = weighted_plan(1000, [0.001, 1.0, 1.0], 10, same_steps=True)
    assert plan.nominal == 34  # ceil(1000 / 30)
    assert plan.shares == (34, 483, 483)
    assert [hi - lo for lo, hi in plan.bounds(0)] == [1] * 34


@pytest.mark.parametrize(("call", "rows", "workers"), [
    (lambda: proportional(3, [1.0] * 4), 3, 4),
    (lambda: proportional(7, [1.0, 1.0], minimum=4), 7, 2),
    (lambda: weighted_plan(3, [1.0] * 4, 2, same_steps=False), 3, 4),
    (lambda: weighted_plan(0, [1.0], 2, same_steps=True), 0, 1),
])
def test_too_few_rows_is_a_data_error(call, rows, workers):
    with pytest.raises(DataError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and f"has {rows} rows" in message and f"{workers} workers" in message


@pytest.mark.parametrize("weights", [[], [1.0, 0.0], [1.0, -2.0], [math.nan], [math.inf, 1.0]])
def test_weights_must_be_positive_and_finite(weights):
    with pytest.raises(ValueError, match="positive and finite"):
        proportional(10, weights)


# ---------------------------------------------------------------- batches


def positions(plan: RowShares, worker: int) -> np.ndarray:
    return np.concatenate([np.arange(lo, hi) for lo, hi in plan.bounds(worker)])


@FAST
@given(rows=st.integers(1, 5000), weights=weights_strategy, batch_size=st.integers(2, 64))
def test_same_steps_plans_split_each_share_evenly_over_the_nominal_steps(rows, weights, batch_size):
    trainers = len(weights)
    assume(rows >= trainers)
    plan = weighted_plan(rows, weights, batch_size, same_steps=True)
    assert not plan.equal and plan.batch_size == batch_size
    assert plan.steps == (plan.nominal,) * trainers
    assert plan.nominal == max(1, math.ceil(rows / (trainers * batch_size)))
    sizes = []
    for worker in range(trainers):
        bounds = plan.bounds(worker)
        assert len(bounds) == plan.nominal
        np.testing.assert_array_equal(positions(plan, worker), np.arange(plan.shares[worker]))
        mine = [hi - lo for lo, hi in bounds]
        assert max(mine) - min(mine) <= 1  # a worker's batches within a row of each other
        assert plan.largest_batch(worker) == max(mine)
        sizes.append(mine)
    global_batches = [sum(step) for step in zip(*sizes)]
    assert sum(global_batches) == rows
    assert rows / plan.nominal <= trainers * batch_size  # the mean global batch is at most trainers * batch_size
    assert all(abs(size - rows / plan.nominal) < trainers for size in global_batches)


@FAST
@given(rows=st.integers(1, 5000), weights=weights_strategy, batch_size=st.integers(1, 64))
def test_own_steps_plans_take_batches_of_at_most_the_batch_size(rows, weights, batch_size):
    trainers = len(weights)
    assume(rows >= trainers)
    plan = weighted_plan(rows, weights, batch_size, same_steps=False)
    assert plan.nominal == nominal_steps(rows, trainers, batch_size)
    for worker in range(trainers):
        bounds = plan.bounds(worker)
        assert plan.steps[worker] == len(bounds) == math.ceil(plan.shares[worker] / batch_size)
        np.testing.assert_array_equal(positions(plan, worker), np.arange(plan.shares[worker]))
        assert all(1 <= hi - lo <= batch_size for lo, hi in bounds)
        assert plan.largest_batch(worker) <= batch_size


@FAST
@given(rows=st.integers(1, 5000), weights=weights_strategy, batch_size=st.integers(2, 64), same_steps=st.booleans())
def test_every_row_is_in_exactly_one_workers_range(rows, weights, batch_size, same_steps):
    assume(rows >= len(weights))
    plan = weighted_plan(rows, weights, batch_size, same_steps)
    ranges = [plan.range(worker) for worker in range(len(weights))]
    assert [stop - start for start, stop in ranges] == list(plan.shares)
    covered = np.concatenate([np.arange(start, stop) for start, stop in ranges])
    np.testing.assert_array_equal(covered, np.arange(rows))
    assert plan_from_shares(list(plan.shares), batch_size, same_steps) == plan  # as a checkpoint gives it back


# ---------------------------------------------------------------- the equal plan is the old partition


@FAST
@given(rows=st.integers(1, 5000), trainers=st.integers(1, 16), batch_size=st.integers(1, 300))
def test_the_equal_plan_is_the_partition_shoal_always_used(rows, trainers, batch_size):
    assume(rows >= trainers)
    plan = equal_plan(rows, trainers, batch_size)
    steps = steps_per_epoch(rows, trainers, batch_size)
    assert plan.equal and plan.batch_size == batch_size
    assert plan.nominal == steps and plan.steps == (steps,) * trainers
    for rank in range(trainers):
        start, stop = share(rows, trainers, rank)
        assert plan.range(rank) == (start, stop)
        assert plan.shares[rank] == stop - start
        assert plan.bounds(rank) == batch_bounds(stop - start, steps, batch_size)
        assert plan.largest_batch(rank) == batch_size


def test_equal_plan_with_fewer_rows_than_workers_is_a_data_error():
    with pytest.raises(DataError, match="3 rows, fewer than the 4 workers"):
        equal_plan(3, 4, 8)


# ---------------------------------------------------------------- the nominal clock


@FAST
@given(steps=st.integers(1, 300), nominal=st.integers(1, 300))
def test_every_nominal_step_is_completed_exactly_once_an_epoch(steps, nominal):
    crossed = [nominal_crossed(step, steps, nominal) for step in range(1, steps + 1)]
    assert [n for block in crossed for n in block] == list(range(1, nominal + 1))
    assert crossed[-1].stop == nominal + 1  # the last local step completes the last nominal one
    if steps <= nominal:
        assert all(len(block) >= 1 for block in crossed)  # a slower clock completes at least one each step
    if steps >= nominal:
        assert all(len(block) <= 1 for block in crossed)  # a faster one at most one


@pytest.mark.parametrize(("steps", "nominal", "expected"), [
    (4, 4, [[1], [2], [3], [4]]),
    (2, 5, [[1, 2], [3, 4, 5]]),
    (6, 3, [[], [1], [], [2], [], [3]]),
    (3, 2, [[], [1], [2]]),
    (1, 3, [[1, 2, 3]]),
])
def test_nominal_crossed_examples(steps, nominal, expected):
    assert [list(nominal_crossed(step, steps, nominal)) for step in range(1, steps + 1)] == expected


# ---------------------------------------------------------------- batch size one


@pytest.mark.parametrize(("rows", "trainers"), [(1001, 2), (5, 2), (10, 3)])
def test_a_same_steps_plan_with_batch_size_one_fits_any_dataset_the_equal_plan_fits(rows, trainers):
    """With batch_size 1 the nominal clock is ceil(rows / trainers), and the minimum of a row a step asks for
    trainers * ceil(rows / trainers) rows: more than there are unless trainers divides rows. The equal plan
    trains such a dataset (steps_per_epoch = rows // trainers); a speed or fixed plan must too."""
    equal_plan(rows, trainers, 1)  # fits
    plan = weighted_plan(rows, [1.0] * trainers, 1, same_steps=True)
    assert sum(plan.shares) == rows
    assert all(hi - lo >= 1 for worker in range(trainers) for lo, hi in plan.bounds(worker))
