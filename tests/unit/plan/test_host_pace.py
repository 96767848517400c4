"""The hosts' pace as the network probe reads it (shoal.plan.network_probe.side_by_side): each rank's median over
rounds timed at once, the slowest median over rank 0's; every round a span of wall time, however a quota
slices it."""

from __future__ import annotations

import types

import pytest
import torch

from shoal.plan import compute_probe, network_probe


class TwoRanks:
    """torch.distributed as rank 0 of two sees it: each all_gather hands back this rank's timing and the peer's
    next one."""

    def __init__(self, peer: list[float]):
        self.peer = iter(peer)

    def get_world_size(self) -> int:
        return 2

    def get_rank(self) -> int:
        return 0

    def all_gather(self, both: list[torch.Tensor], mine: torch.Tensor) -> None:
        both[0].copy_(mine)
        both[1].fill_(next(self.peer))


def test_even_hosts_with_noisy_rounds_read_one_pace(monkeypatch):
    """Rank 0's rounds are 1.0 throughout; the peer's scatter either side of 1.0. A median of each round's
    slower over rank 0's read 1.1 here; the peer's median over rank 0's reads 1.0."""
    monkeypatch.setattr(torch, "distributed", TwoRanks([0.9, 1.2, 1.0, 1.1, 0.95]))
    monkeypatch.setattr(network_probe, "mean_over", lambda work, seconds: 1.0)
    assert network_probe.side_by_side(lambda: None, 0.5) == (1.0, 1.0)


def test_a_slower_host_reads_its_median_over_rank_zeros(monkeypatch):
    monkeypatch.setattr(torch, "distributed", TwoRanks([1.5, 1.4, 1.6, 3.0, 1.5]))
    monkeypatch.setattr(network_probe, "mean_over", lambda work, seconds: 1.0)
    assert network_probe.side_by_side(lambda: None, 0.5) == (1.0, pytest.approx(1.5))


def test_a_round_spans_the_quotas_window_where_there_is_one(monkeypatch):
    asked = []
    monkeypatch.setattr(torch, "distributed", TwoRanks([1.0] * 10))
    monkeypatch.setattr(network_probe, "mean_over", lambda work, seconds: asked.append(seconds) or 1.0)
    monkeypatch.setattr(network_probe, "least_window", lambda threads: 1.6)
    network_probe.side_by_side(lambda: None, 0.5)
    monkeypatch.setattr(network_probe, "least_window", lambda threads: 0.0)
    network_probe.side_by_side(lambda: None, 0.5)
    assert asked == [1.6] * 5 + [0.25] * 5


class Clock:
    """A clock that moves only when the timed work runs: each call takes `step` seconds, whatever the machine's
    load."""

    def __init__(self, step: float):
        self.now, self.step, self.calls = 0.0, step, 0

    def perf_counter(self) -> float:
        return self.now

    def work(self) -> None:
        self.calls += 1
        self.now += self.step


def test_the_burst_is_timed_for_the_seconds_asked_and_averaged(monkeypatch):
    clock = Clock(0.005)
    monkeypatch.setattr(compute_probe, "time", clock)
    assert network_probe.mean_over(clock.work, 0.1) == pytest.approx(0.005)
    assert clock.calls == 1 + 20  # the warm-up call, then calls until 0.1 s have passed


class PeerDone(TwoRanks):
    """A peer whose timings are always done: every all_reduce (MAX) keeps this rank's number."""

    ReduceOp = types.SimpleNamespace(MAX="max")

    def __init__(self):
        super().__init__([])
        self.reduced = 0

    def all_reduce(self, tensor: torch.Tensor, op) -> None:
        self.reduced += 1


def test_under_a_quota_the_exchanges_are_timed_until_the_window_is_spanned(monkeypatch):
    """Three calls of 5 ms would do without a quota; with a window of 0.1 s, rounds of three go on until it
    has passed, and both ranks decide together after each round (one all_reduce a round)."""
    fake, clock = PeerDone(), Clock(0.005)
    monkeypatch.setattr(torch, "distributed", fake)
    monkeypatch.setattr(network_probe, "time", clock)
    monkeypatch.setattr(network_probe, "least_window", lambda threads: 0.0)
    assert network_probe.repeat(clock.work, seconds=0.001, least=3) == pytest.approx(0.005)
    assert clock.calls == 4 and fake.reduced == 2  # the warm-up and three timed; the first timing and one decision
    fake, clock = PeerDone(), Clock(0.005)
    monkeypatch.setattr(torch, "distributed", fake)
    monkeypatch.setattr(network_probe, "time", clock)
    monkeypatch.setattr(network_probe, "least_window", lambda threads: 0.1)
    assert network_probe.repeat(clock.work, seconds=0.001, least=3) == pytest.approx(0.005)
    # after the warm-up: three timed, then rounds of three until 0.1 s (20 calls) have passed: 21 in all
    assert clock.calls == 1 + 21 and fake.reduced == 1 + 7
