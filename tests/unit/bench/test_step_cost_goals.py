"""The goals benchmarks/step_cost.py and benchmarks/uneven.py judge their runs by: the arithmetic, on made-up runs."""

from __future__ import annotations

import argparse

import pytest
from benchmarks import step_cost, uneven


def rows(*steps: float) -> list[dict]:
    return [{"step": step, "steps": 20, "compute": step / 2, "communication": step / 2, "data": 0.0, "other": 0.0}
            for step in steps]


def test_a_round_s_ratio_pairs_sync_with_the_ddp_run_of_the_same_round_and_skips_a_failed_one():
    sync = rows(2.0, 3.0) + [{"error": "lost"}]
    ddp = rows(1.0, 4.0, 5.0)
    assert step_cost.paired(sync, ddp) == [2.0, 0.75]


def test_two_trainers_count_twice_against_one_host_and_a_served_algorithm_s_one_trainer_once():
    found = {"alone": {"step": 0.010}, "sync": {"step": 0.010}, "averaging": {"step": 0.0125},
             "downpour": {"step": 0.005}}
    assert step_cost.over_one_host(found, "sync") == pytest.approx(2.0)
    assert step_cost.over_one_host(found, "averaging") == pytest.approx(1.6)
    assert step_cost.over_one_host(found, "downpour") == pytest.approx(2.0)
    assert step_cost.over_one_host(found, "easgd") is None


def test_goals_judge_a_speed_up_from_below_and_the_ratios_from_above():
    args = argparse.Namespace(variants=["alone", "ddp", "sync", "averaging"])
    runs = {"alone": rows(0.010, 0.010, 0.010), "ddp": rows(0.0130, 0.0125, 0.0120),
            "sync": rows(0.0120, 0.0120, 0.0120), "averaging": rows(0.020, 0.020, 0.020)}
    judged = {goal["goal"]: goal for goal in step_cost.goals(step_cost.summary("mlp", runs, args))}
    assert judged["two_hosts"]["ratio"] == pytest.approx(2 / 1.2) and judged["two_hosts"]["met"] is True
    assert judged["sync_ddp"]["ratio"] == pytest.approx(0.96) and judged["sync_ddp"]["met"] is True
    assert judged["sync_ddp_paired"]["ratio"] == pytest.approx(0.96)
    assert judged["steady"]["ratio"] == pytest.approx(0.0) and judged["steady"]["met"] is True
    assert judged["downpour_update"]["met"] is None
    text = step_cost.goals_list(list(judged.values()))
    assert "(at least 1.6x): met" in text and "not measured" in text


def test_speed_shares_more_than_2_percent_slower_than_equal_are_a_missed_goal():
    made = [{"algorithm": "averaging", "balance": "equal", "seconds_per_epoch": 1.0},
            {"algorithm": "averaging", "balance": "speed", "seconds_per_epoch": 1.03},
            {"algorithm": "sync", "balance": "equal", "seconds_per_epoch": 2.0},
            {"algorithm": "sync", "balance": "speed", "seconds_per_epoch": 2.02},
            {"algorithm": "easgd", "balance": "equal", "failed": "lost"}]
    lines = uneven.never_slower(made, ["averaging", "sync", "easgd"]).splitlines()
    assert lines[0] == "- averaging: speed / equal 1.030x (limit 1.02x): **missed**"
    assert lines[1] == "- sync: speed / equal 1.010x (limit 1.02x): met"
    assert lines[2] == "- easgd: speed / equal not measured"
