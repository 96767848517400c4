"""Speed shares that never lose: a move the measured epoch did not repay is taken back and held, workers of one
machine follow their machine's rate, and the judgment under way survives a checkpoint.

Epoch times are recorded figures (each worker's `seconds`, as every rank gathers them), never measured here.
"""

from __future__ import annotations

import pytest

from shoal.train.balancer import GAIN, HOLD, Balancer, epoch_seconds, machine_rates
from shoal.train.loop import EpochStats
from tests.unit.train.test_balancer import BATCH, ROWS, TRAINERS, figures, through_a_checkpoint

RATES = [2.0, 1.0, 1.0]  # the rates say: worker 0 twice the rows
EQUAL, MOVED = (400, 400, 400), (600, 300, 300)


def moved_balancer(same_steps: bool = True) -> Balancer:
    """A speed balancer whose shares just moved after an epoch of 400 s on equal shares."""
    balancer = Balancer("speed", ROWS, TRAINERS, BATCH, same_steps)
    assert balancer.observe(figures(EQUAL, RATES, seconds=400.0)).shares == MOVED
    assert balancer.previous == EQUAL and balancer.before == 400.0 and not balancer.taken_back
    return balancer


@pytest.mark.parametrize("same_steps", [True, False])
def test_a_move_that_shortened_the_epoch_is_kept(same_steps):
    balancer = moved_balancer(same_steps)
    assert balancer.observe(figures(MOVED, RATES, seconds=400.0 * (1 - GAIN) - 1)) is None
    assert balancer.plan.shares == MOVED and balancer.previous is None and not balancer.taken_back
    assert balancer.hold == 0


@pytest.mark.parametrize("seconds", [400.0 * (1 - GAIN), 400.0, 480.0])  # not shorter by more than GAIN
def test_a_move_that_did_not_shorten_the_epoch_is_taken_back_and_held(seconds):
    balancer = moved_balancer()
    back = balancer.observe(figures(MOVED, RATES, seconds=seconds))
    assert back is balancer.plan and back.shares == EQUAL and balancer.taken_back
    assert balancer.previous is None and balancer.hold == HOLD
    # held for HOLD epochs on the shares before, though the rates still call for the move
    for _ in range(HOLD - 1):
        assert balancer.observe(figures(EQUAL, RATES, seconds=400.0)) is None
        assert balancer.plan.shares == EQUAL and not balancer.taken_back
    # the HOLD-th epoch on them ends the hold: the move is tried again, and judged again
    again = balancer.observe(figures(EQUAL, RATES, seconds=400.0))
    assert again is not None and again.shares == MOVED and balancer.previous == EQUAL
    assert balancer.observe(figures(MOVED, RATES, seconds=300.0)) is None  # this time it paid: kept
    assert balancer.plan.shares == MOVED


def test_re_reading_a_moved_share_does_not_count_against_the_move():
    balancer = moved_balancer()
    epoch = figures(MOVED, RATES, seconds=390.0)
    epoch[0].seconds, epoch[0].reading = 450.0, 60.0  # 60 s of rows the move added, read once
    epoch[0].data += 60.0
    assert epoch_seconds(epoch) == 390.0
    assert balancer.observe(epoch) is None and balancer.plan.shares == MOVED


def test_a_process_s_first_epoch_does_not_judge_a_move():
    balancer = moved_balancer()
    assert balancer.observe(figures(MOVED, RATES, seconds=900.0), warm=False) is None  # its start, not the shares
    assert balancer.previous == EQUAL and balancer.plan.shares == MOVED
    assert balancer.observe(figures(MOVED, RATES, seconds=900.0)).shares == EQUAL  # the next one does
    assert balancer.taken_back


def test_the_same_figures_give_every_rank_the_same_decisions():
    sequence = [(EQUAL, 400.0), (MOVED, 410.0)] + [(EQUAL, 400.0)] * HOLD + [(MOVED, 350.0), (MOVED, 352.0)]
    ranks = [Balancer("speed", ROWS, TRAINERS, BATCH, True) for _ in range(3)]
    for shares, seconds in sequence:
        decisions = [rank.observe(figures(shares, RATES, seconds=seconds)) for rank in ranks]
        assert all(decision == decisions[0] for decision in decisions)
        assert len({(rank.plan, rank.hold, rank.previous, rank.before, rank.taken_back) for rank in ranks}) == 1


# ---------------------------------------------------------------- workers sharing a machine


def test_workers_of_one_machine_take_its_mean_rate():
    assert machine_rates([4.0, 2.0, 3.0, 1.0], ["a", "a", "b", "c"]) == [3.0, 3.0, 3.0, 1.0]
    assert machine_rates([4.0, 0.0, 0.0], ["a", "a", "b"]) == [4.0, 4.0, 0.0]  # a worker that measured none
    assert machine_rates([4.0, 2.0], None) == [4.0, 2.0]  # no hosts known: each worker its own machine
    assert machine_rates([4.0, 2.0], ["a", "a"]) == [4.0, 2.0]  # one machine: no other to move rows to


def test_shares_move_between_machines_not_between_workers_that_share_cores():
    # hosts a (two workers) and b (one): a's workers measured 3 and 1 rows/s on shared cores, b's worker 2
    balancer = Balancer("speed", ROWS, TRAINERS, BATCH, False, hosts=["a", "a", "b"])
    moved = balancer.observe(figures(EQUAL, [3.0, 1.0, 1.0]))
    assert balancer.rates == [2.0, 2.0, 1.0]
    assert moved.shares == (480, 480, 240)  # a's workers alike; machine a takes four fifths (its 4 of 5 rows/s)
    alone = Balancer("speed", ROWS, TRAINERS, BATCH, False)
    assert alone.observe(figures(EQUAL, [3.0, 1.0, 1.0])).shares == (720, 240, 240)  # per worker: misled


# ---------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("same_steps", [True, False])
def test_a_checkpoint_after_a_take_back_resumes_the_same_decisions(same_steps):
    balancer = moved_balancer(same_steps)
    balancer.observe(figures(MOVED, RATES, seconds=420.0))  # taken back
    balancer.observe(figures(EQUAL, RATES, seconds=400.0))  # one epoch of the hold
    resumed = Balancer("speed", ROWS, TRAINERS, BATCH, same_steps)
    resumed.load_state_dict(through_a_checkpoint(balancer.state_dict()))
    assert (resumed.plan, resumed.rates, resumed.hold, resumed.before, resumed.previous) == (
        balancer.plan, balancer.rates, balancer.hold, balancer.before, balancer.previous)
    later = [(EQUAL, 400.0)] * (HOLD - 1) + [(MOVED, 397.0)]  # the rest of the hold, the move again, a loss
    for shares, seconds in later:
        assert resumed.observe(figures(shares, RATES, seconds=seconds)) == balancer.observe(
            figures(shares, RATES, seconds=seconds))
        assert (resumed.plan, resumed.hold, resumed.previous, resumed.taken_back) == (
            balancer.plan, balancer.hold, balancer.previous, balancer.taken_back)
    assert balancer.taken_back and balancer.plan.shares == EQUAL  # 397 s is not 1% under 400 s


def test_a_checkpoint_with_a_move_under_judgment_judges_it_after_the_resume():
    balancer = moved_balancer()
    resumed = Balancer("speed", ROWS, TRAINERS, BATCH, True)
    resumed.load_state_dict(through_a_checkpoint(balancer.state_dict()))
    assert resumed.plan.shares == MOVED and resumed.previous == EQUAL and resumed.before == 400.0
    assert resumed.observe(figures(MOVED, RATES, seconds=500.0)).shares == EQUAL and resumed.taken_back


def test_a_checkpoint_written_before_moves_were_judged_still_loads():
    old = {"shares": list(MOVED), "rates": RATES}  # the balancer state of earlier checkpoints
    resumed = Balancer("speed", ROWS, TRAINERS, BATCH, True)
    resumed.load_state_dict(through_a_checkpoint(old))
    assert resumed.plan.shares == MOVED and resumed.rates == RATES
    assert resumed.previous is None and resumed.before is None and resumed.hold == 0
    assert resumed.observe(figures(MOVED, RATES, seconds=999.0)) is None  # no move under judgment: none taken back
    assert resumed.plan.shares == MOVED and resumed.before == 999.0


def test_epoch_seconds_is_the_slowest_trainer_s():
    assert epoch_seconds([EpochStats(seconds=3.0), EpochStats(seconds=5.0, reading=1.0), EpochStats(seconds=2.0)]) \
        == 4.0
