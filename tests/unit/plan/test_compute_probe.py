"""The compute probe: its sampling of a step after an idle wait (counts bounded by time and by number), and its
timed optimizer update."""

from __future__ import annotations

import time

import torch

from shoal.plan.compute_probe import cold_and_warm, cold_and_warm_pairs, update_work


def test_cold_and_warm_times_a_step_after_the_wait_and_one_right_after():
    calls = []

    def work():
        calls.append(time.perf_counter())
        time.sleep(0.002 if len(calls) == 1 else 0.001)

    began = time.perf_counter()
    cold, warm = cold_and_warm(work, 0.01)
    assert calls[0] - began >= 0.01  # the first call waited the idle time; it is not counted in its seconds
    assert cold >= 0.002 and 0.001 <= warm < cold


def test_pairs_stop_at_the_most_asked_for():
    assert len(cold_and_warm_pairs(lambda: None, 0.0, seconds=10.0, most=7)) == 7


def test_pairs_stop_after_the_time_with_at_least_one():
    pairs = cold_and_warm_pairs(lambda: None, 0.05, seconds=0.01, most=100)
    assert len(pairs) == 1  # the first wait alone outlasts the time
    assert 2 <= len(cold_and_warm_pairs(lambda: None, 0.01, seconds=0.05, most=100)) <= 6


def test_the_timed_update_keeps_momentum_normal_and_the_probed_model_as_it_was():
    model = torch.nn.Sequential(torch.nn.Linear(20, 8), torch.nn.Sigmoid(), torch.nn.Linear(8, 3))
    before = [parameter.detach().clone() for parameter in model.parameters()]
    step = update_work(model, {"name": "sgd", "lr": 0.1, "momentum": 0.9})
    with torch.no_grad():
        for _ in range(2000):  # zero gradients would leave momentum subnormal after some 850 steps
            step()
    optimizer = step.__self__
    for buffer in (optimizer.state[parameter]["momentum_buffer"] for group in optimizer.param_groups
                   for parameter in group["params"]):
        assert torch.all(buffer.abs() >= torch.finfo(torch.float32).tiny)
    assert all(parameter.equal(old) for parameter, old in zip(model.parameters(), before))
