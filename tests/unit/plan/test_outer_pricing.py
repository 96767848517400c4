"""The planner's price of averaging's outer optimizer: OUTER_PASSES copies of the parameters a round across all
workers, nothing more on the wire (the round sends what it sends without it)."""

from __future__ import annotations

import pytest

from shoal.plan.predict import OUTER_PASSES, Layout, predict
from tests.unit.plan.test_predict import NETWORK, compute, shape

OUTER = {"name": "nesterov", "lr": 0.7, "momentum": 0.9}
COPY = 1e-9  # seconds a byte


@pytest.mark.parametrize(("workers", "period", "rounds"), [(2, 10, 5), (4, "epoch", 1), (1, 5, 20)])
def test_each_round_adds_its_passes_over_the_parameters(workers, period, rounds):
    plain = predict(shape("averaging", options={"period": period}), Layout(workers, 1),
                    compute(copy_seconds_per_byte=COPY), NETWORK)
    outer = predict(shape("averaging", options={"period": period, "outer": OUTER}), Layout(workers, 1),
                    compute(copy_seconds_per_byte=COPY), NETWORK)
    assert outer.steps == plain.steps
    assert outer.epoch_seconds - plain.epoch_seconds == pytest.approx(rounds * OUTER_PASSES * 999 * 4 * COPY)
    assert outer.bytes_per_epoch == plain.bytes_per_epoch
