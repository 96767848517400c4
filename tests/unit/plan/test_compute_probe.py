"""The compute probe: its sampling of a step after an idle wait (counts bounded by time and by number), the table
of what such a step costs, and its timed optimizer update."""

from __future__ import annotations

import contextlib
import time
import types

import numpy as np
import torch

from shoal.plan import compute_probe
from shoal.plan.compute_probe import cold_steps, resume_table, timed_loop, update_work
from shoal.train.objective import Objective
from tests.unit.plan.test_predict import compute


def test_a_cold_step_is_timed_after_the_wait_and_without_it():
    calls = []

    def work():
        calls.append(time.perf_counter())
        time.sleep(0.002)

    began = time.perf_counter()
    (cold,) = cold_steps(work, 0.01, seconds=0.0, most=5)
    assert calls[0] - began >= 0.01  # the call waited the idle time; it is not counted in its seconds
    assert 0.002 <= cold < 0.01


def test_cold_steps_stop_at_the_most_asked_for():
    assert len(cold_steps(lambda: None, 0.0, seconds=10.0, most=7)) == 7


def test_cold_steps_stop_after_the_time_with_at_least_one():
    assert len(cold_steps(lambda: None, 0.05, seconds=0.01, most=100)) == 1  # the first wait alone outlasts it
    assert 2 <= len(cold_steps(lambda: None, 0.01, seconds=0.05, most=100)) <= 6


class SlowAfterIdle:
    """A step of 1 ms back to back; after an idle gap of more than 3 ms, it and the next one take 2 ms (caches
    warm up over more than one step)."""

    def __init__(self):
        self.ended, self.cold_left = time.perf_counter(), 0

    def __call__(self):
        if time.perf_counter() - self.ended > 0.003:
            self.cold_left = 2
        time.sleep(0.002 if self.cold_left else 0.001)
        self.cold_left = max(self.cold_left - 1, 0)
        self.ended = time.perf_counter()


def test_the_resume_table_measures_a_cold_step_beyond_back_to_back_steps_and_never_falls():
    table = resume_table(SlowAfterIdle(), waits=(0.0005, 0.006, 0.012), seconds=0.3, most=30)
    assert list(table) == [0.0005, 0.006, 0.012]
    assert table[0.0005] < 0.0005  # the short wait leaves the step as it was
    # a whole millisecond beyond the back-to-back step, though the step right after the cold one is as slow
    assert 0.0006 <= table[0.006] <= 0.002
    assert table[0.012] >= table[0.006]


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


def test_the_loop_factor_divides_the_real_step_by_the_probed_one_timed_before_and_after_it(monkeypatch):
    """A slow spell through the real job and the probe's second timing moves both sides of the ratio."""
    events = []

    class Probe:
        window = 0.0  # no CPU quota

        def step(self, batch):
            events.append(("probe", batch))
            return [0.001, 0.001] if len(events) == 1 else [0.003, 0.003]

    def real_job(job, threads, steps):
        events.append(("real job", job.train.batch_size, steps))
        return 4.0, 0.003

    monkeypatch.setattr(compute_probe, "measure_loop", real_job)
    job = types.SimpleNamespace(train=types.SimpleNamespace(batch_size=128))
    assert timed_loop(Probe(), job, threads=1) == (4.0, 1.5, (0.001, 0.003))  # and the probe's two timings
    assert events == [("probe", 128), ("real job", 128, 100), ("probe", 128)]
    assert compute_probe.loop_factor(0.1, 0.001) == 3.0 and compute_probe.loop_factor(0.001, 0.0) == 1.0


def test_the_ladder_stops_above_the_jobs_batch_where_a_step_would_take_too_long():
    """A step costing 1 ms a row: 16 to 256 are timed (256 ms), 1024 would take 1 s and is left out with 4096."""
    asked = []

    def step(batch):
        asked.append(batch)
        return [batch * 0.001] * 3

    found = compute_probe.ladder_round(step, [16, 64, 128, 256, 1024, 4096], own=128)
    assert asked == [16, 64, 128, 256] and sorted(found) == asked
    assert found[256] == [0.256] * 3


def test_the_jobs_own_batch_and_those_below_it_are_timed_however_long():
    asked = []

    def step(batch):
        asked.append(batch)
        return [batch * 0.01]

    assert sorted(compute_probe.ladder_round(step, [16, 64, 256, 1024, 4096], own=256)) == [16, 64, 256]
    assert asked == [16, 64, 256]


def test_a_fast_model_times_the_whole_ladder():
    found = compute_probe.ladder_round(lambda batch: [batch * 1e-5], [16, 64, 128, 256, 1024, 4096], own=128)
    assert sorted(found) == [16, 64, 128, 256, 1024, 4096]


def test_the_calibration_job_takes_fewer_steps_where_they_are_long():
    """100 steps an epoch while they take 2 s or less; then as many as fit in 2 s, not under 10."""
    assert [compute_probe.loop_steps(seconds) for seconds in (0.0, 0.001, 0.02, 0.05, 0.23, 5.0)] == \
        [100, 100, 100, 40, 10, 10]


def test_under_a_cpu_quota_a_calibration_epoch_spans_the_window():
    """A host of 10 ms turns in 80 ms periods: an epoch of 5 ms steps lasts 20 periods (1.6 s), not 100 steps."""
    assert compute_probe.loop_steps(0.005, window=1.6) == 320
    assert compute_probe.loop_steps(0.05, window=1.6) == 40  # long steps: the 2 s cut already spans the window
    assert compute_probe.loop_steps(0.001, window=0.0) == 100


def test_under_a_quota_a_call_counts_at_its_mean_as_the_pauses_count_too():
    """Seven calls ran within a turn and one waited out the period's rest: the median would price the machine at
    its undivided speed."""
    probe = types.SimpleNamespace(window=1.6)
    samples = [0.001] * 7 + [0.071]
    assert compute_probe.ComputeProbe.typical(probe, samples) == np.mean(samples)
    assert compute_probe.ComputeProbe.typical(types.SimpleNamespace(window=0.0), samples) == 0.001


def test_a_slow_moment_does_not_cut_the_ladder():
    """Its fastest timing prices the next size: 256 at 1 ms a row read 0.3 s once and 0.1 s after (1024: 0.4 s)."""
    timings = {16: [0.001], 64: [0.004], 256: [0.3, 0.1], 1024: [0.4], 4096: [1.6]}
    found = compute_probe.ladder_round(timings.get, [16, 64, 256, 1024, 4096], own=64)
    assert sorted(found) == [16, 64, 256, 1024]


def test_a_batch_the_ladder_did_not_reach_gains_its_probed_step_beside_its_loop_factor(monkeypatch):
    monkeypatch.setattr(compute_probe, "ComputeProbe", lambda job, threads: contextlib.nullcontext())
    monkeypatch.setattr(compute_probe, "timed_loop", lambda probe, job, threads: (4.0, 1.2, (0.5, 0.7)))
    measured = compute(step_seconds={16: 0.1, 64: 0.2}, loop_factors={64: 1.0}, pace_range=1.1)

    def at(batch):
        return types.SimpleNamespace(train=types.SimpleNamespace(batch_size=batch))

    grown = compute_probe.with_loop_at(measured, at(1024), threads=1)
    assert grown.step_seconds == {16: 0.1, 64: 0.2, 1024: 0.6}  # the probed step around the real loop
    assert grown.loop_factors == {64: 1.0, 1024: 1.2} and grown.pace_range == 0.7 / 0.5
    assert compute_probe.with_loop_at(measured, at(16), threads=1).step_seconds == measured.step_seconds


class RowsModel(torch.nn.Module):
    """A forward pass that takes `per_row` seconds a row, recording the rows it was given and whether it ran in
    training mode and with gradients."""

    def __init__(self, per_row: float):
        super().__init__()
        self.per_row, self.rows, self.modes = per_row, [], set()

    def forward(self, inputs):
        self.rows.append(len(inputs))
        self.modes.add((self.training, torch.is_grad_enabled()))
        time.sleep(self.per_row * len(inputs))
        return inputs


def evaluation_probe(rows: int, per_row: float):
    """What evaluate_per_row reads of a ComputeProbe: its loader's rows and its model."""
    loader = types.SimpleNamespace(rows=rows, features=np.zeros((rows, 2), np.float32), labels=np.zeros(rows, np.int64),
                                   to_tensors=lambda features, labels: (torch.from_numpy(features),
                                                                        torch.from_numpy(labels)))
    probe = types.SimpleNamespace(loader=loader, model=RowsModel(per_row),
                                  prepared=types.SimpleNamespace(objective=Objective("cross_entropy", 2),
                                                                 evaluation_step=None))
    probe.evaluate_rows = lambda: compute_probe.ComputeProbe.evaluate_rows(probe)
    probe.seconds, probe.typical = compute_probe.TIMED_SECONDS, compute_probe._median
    return probe


def test_a_slow_forward_is_timed_on_fewer_rows_than_evaluation_takes():
    """0.2 ms a row: 8192 rows would take 1.6 s; at most 2,500 take the 0.5 s allowed, priced from 256 rows (a
    sleep overshoots, never falls short), each timing a whole evaluation of them: forward, loss and metrics."""
    probe = evaluation_probe(20_000, per_row=0.0002)
    probe.model.train()
    per_row = compute_probe.ComputeProbe.evaluate_per_row(probe)
    assert probe.model.rows[:2] == [256, 256]  # the first call apart, then one timed
    assert 1000 <= probe.model.rows[2] <= 2500 and set(probe.model.rows[2:]) == {probe.model.rows[2]}
    assert 0.0002 <= per_row <= 0.00025  # seconds per row, whatever rows were timed
    assert probe.model.modes == {(False, False)}  # evaluated as evaluation runs: eval mode, no gradients
    assert probe.model.training  # and back to training after


def test_a_forward_slow_even_on_few_rows_is_timed_on_256(monkeypatch):
    monkeypatch.setattr(compute_probe, "LARGEST_STEP", 0.001)  # 256 rows at 0.01 ms a row take 2.56 ms
    assert compute_probe.ComputeProbe.evaluate_rows(evaluation_probe(20_000, per_row=1e-5)) == 256


def test_a_fast_forward_is_timed_on_as_many_rows_as_evaluation_takes():
    probe = evaluation_probe(20_000, per_row=1e-7)
    assert compute_probe.ComputeProbe.evaluate_rows(probe) == compute_probe.EVALUATE_ROWS == 8192


def test_a_small_set_is_evaluated_whole():
    small = evaluation_probe(100, per_row=1e-5)
    assert compute_probe.ComputeProbe.evaluate_rows(small) == 100 and small.model.rows == [100, 100]
    assert compute_probe.ComputeProbe.evaluate_rows(evaluation_probe(3000, per_row=1e-7)) == 3000
