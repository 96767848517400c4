"""Predictions of each algorithm's epoch against the same sums done by hand, and the planner's choices."""

from __future__ import annotations

import math

import pytest

from shoal.plan.costs import Link
from shoal.plan.planner import make_plan, rows_text
from shoal.plan.predict import EVALUATION_COLD, Layout, Shape, predict, slowest_pace
from shoal.plan.profile import Compute, Network, Profile
from shoal.plan.render import render

ACROSS = Link(latency=1e-3, bandwidth=1e6)
INSIDE = Link(latency=1e-5, bandwidth=1e9)


def compute(**changes) -> Compute:
    values = dict(model="m", parameters=999, threads=1, step_seconds={100: 0.01, 200: 0.02}, update_seconds=0.001,
                  copy_seconds_per_byte=0.0, evaluate_seconds_per_row=1e-5, load_rows_per_second=1e5,
                  startup_seconds=5.0, step_spread=0.0)
    return Compute(**{**values, **changes})


def shape(algorithm: str = "sync", **changes) -> Shape:
    values = dict(parameters=999, buffers=0, rows=10_000, test_rows=1000, batch=100, epochs=3, eval_every=1,
                  algorithm=algorithm, options={})
    return Shape(**{**values, **changes})


NETWORK = Network(across=ACROSS, inside=INSIDE, source="test")


def test_one_worker_is_its_steps_and_nothing_else():
    found = predict(shape(), Layout(1, 1), compute(), NETWORK)
    assert found.steps == 100
    assert found.epoch_seconds == pytest.approx(100 * 0.01)
    assert found.communication_seconds == 0
    # evaluation after an epoch's work: the probe's (back to back) times EVALUATION_COLD
    assert found.evaluation_seconds == pytest.approx(1000 * 1e-5 * EVALUATION_COLD)
    assert found.job_seconds == pytest.approx(5.0 + 10_000 / 1e5 + 3 * 1.0 + 3 * 1000 * 1e-5 * EVALUATION_COLD)


def test_held_out_rows_are_validated_after_each_epoch_not_trained_on():
    """A fifth held out of 10,000 rows: 2,000, validated by the 2 trainers after each epoch, 1,000 each; the
    epoch's steps are the 8,000 others', and its time (epoch_end's) leaves the validation out."""
    found = predict(shape("averaging", validation_split=0.2), Layout(2, 1), compute(), NETWORK)
    plain = predict(shape("averaging"), Layout(2, 1), compute(), NETWORK)
    assert found.steps == 40 and plain.steps == 50
    assert found.validation_seconds == pytest.approx(1000 * 1e-5) and plain.validation_seconds == 0
    assert found.epoch_seconds == pytest.approx(plain.epoch_seconds - 10 * 0.01)
    assert found.job_seconds == pytest.approx(plain.job_seconds - 3 * 10 * 0.01 + 3 * 1000 * 1e-5)
    # the line through job seconds against rows prices each row's share of steps and of validation
    assert found.line.per_row == pytest.approx(
        (1 / 1e5 + 3 * (0.8 * 0.01 / 100 + 0.2 * 1e-5)) / 2)


def test_sync_pays_a_ring_all_reduce_of_the_gradients_every_step():
    found = predict(shape(), Layout(2, 1), compute(), NETWORK)
    size = 999 * 4  # the gradients: one bucket after the backward pass ("auto" is priced as a CPU worker's)
    reduce = 2 * (1e-3 + size / 2 / 1e6)
    assert found.steps == 50
    # the row count rides in the bucket: no collective of its own
    assert found.communication_seconds == pytest.approx(50 * reduce)
    assert found.epoch_seconds == pytest.approx(50 * (0.01 + reduce))
    assert found.bytes_per_epoch == pytest.approx(50 * size)


def test_sync_with_accumulated_batches_exchanges_once_per_group_and_the_leftover():
    # 50 steps in groups of 4: 12 whole groups and the epoch's last 2 batches, 13 exchanges
    found = predict(shape(accumulate=4), Layout(2, 1), compute(), NETWORK)
    reduce = 2 * (1e-3 + 999 * 4 / 2 / 1e6)
    assert found.steps == 50
    assert found.communication_seconds == pytest.approx(13 * reduce)
    assert found.bytes_per_epoch == pytest.approx(13 * 999 * 4)


def test_sync_in_batch_mode_exchanges_once_an_epoch():
    # cNeural's batch mode (accumulate = "epoch"): the whole share's gradient, one all-reduce
    found = predict(shape(accumulate="epoch"), Layout(2, 1), compute(), NETWORK)
    reduce = 2 * (1e-3 + 999 * 4 / 2 / 1e6)
    assert found.communication_seconds == pytest.approx(reduce)
    assert found.epoch_seconds == pytest.approx(50 * 0.01 + reduce)
    assert found.bytes_per_epoch == pytest.approx(999 * 4)


def test_averaging_each_epoch_exchanges_the_weights_once():
    found = predict(shape("averaging"), Layout(4, 1), compute(), NETWORK)
    reduce = 6 * (1e-3 + 999 * 4 / 4 / 1e6)
    assert found.steps == 25
    assert found.epoch_seconds == pytest.approx(25 * 0.01 + reduce)


def test_averaging_each_epoch_waits_at_its_barrier_for_the_slowest_workers_epoch_of_steps():
    # a period of every step of the epoch: the pair's measured spread grows as the root of the steps summed
    found = predict(shape("averaging"), Layout(2, 1), compute(step_spread=1e-4), NETWORK)
    reduce = 2 * (1e-3 + 999 * 4 / 2 / 1e6)
    assert found.steps == 50
    assert found.communication_seconds == pytest.approx(reduce + 1e-4 * math.sqrt(50))


def test_the_slowest_of_workers_whose_pace_moves_on_its_own():
    # each at the fast or the slow end half of the time: the slowest of 2 is slow 3/4 of the time
    assert slowest_pace(1.5, 2) == pytest.approx((0.25 * 1.0 + 0.75 * 1.5) / 1.25)
    assert slowest_pace(1.5, 3) == pytest.approx((0.125 * 1.0 + 0.875 * 1.5) / 1.25)
    assert slowest_pace(1.5, 1) == 1.0 and slowest_pace(1.0, 16) == 1.0
    assert slowest_pace(2.0, 64) == pytest.approx(4 / 3)  # always at the slow end, against a typical 1.5


def test_workers_that_wait_for_one_another_go_at_the_slowest_ones_pace():
    moving = compute(pace_range=1.5)
    steady = predict(shape("averaging"), Layout(2, 1), compute(), NETWORK)
    found = predict(shape("averaging"), Layout(2, 1), moving, NETWORK)
    assert found.compute_seconds == pytest.approx(steady.compute_seconds * 1.1)
    assert found.communication_seconds == pytest.approx(steady.communication_seconds)
    one = predict(shape("averaging"), Layout(1, 1), moving, NETWORK)
    assert one.compute_seconds == pytest.approx(100 * 0.01)  # one worker waits for no one
    # a host measured slower than that sets the pace alone; a server's trainers wait for no other trainer
    slower = Network(across=ACROSS, inside=INSIDE, source="test", slowest_host=1.3)
    assert predict(shape("averaging"), Layout(2, 1), moving, slower).compute_seconds == pytest.approx(
        steady.compute_seconds * 1.3)
    assert predict(shape("downpour"), Layout(3, 1), moving, NETWORK).compute_seconds == pytest.approx(
        predict(shape("downpour"), Layout(3, 1), compute(), NETWORK).compute_seconds)


def test_averaging_every_period_steps_rounds_up_the_last_round():
    found = predict(shape("averaging", options={"period": 10}), Layout(2, 1), compute(), NETWORK)
    reduce = 2 * (1e-3 + 999 * 4 / 2 / 1e6)
    assert found.communication_seconds == pytest.approx(math.ceil(50 / 10) * reduce)


def test_downpour_with_one_trainer_waits_for_both_messages_and_the_servers_step():
    found = predict(shape("downpour"), Layout(2, 1), compute(), NETWORK)
    update, reply = 999 * 4 + 64, 999 * 4 + 64
    exchange = ACROSS.seconds(update) + ACROSS.seconds(reply) + 0.001  # the server's optimizer step
    assert found.trainers == 1 and found.steps == 100
    # a trainer takes no optimizer step of its own
    assert found.epoch_seconds == pytest.approx(100 * (0.01 - 0.001 + exchange))
    assert found.staleness == 0


def test_a_worker_back_from_a_wait_pays_its_cold_start_in_compute():
    cold = compute(resume_seconds={0.001: 0.0002, 0.1: 0.004})
    size = 999 * 4
    reduce = 2 * (1e-3 + size / 2 / 1e6)  # 6 ms: between the measured waits
    resume = 0.0002 + math.log(reduce / 0.001) / math.log(100) * 0.0038
    found = predict(shape(), Layout(2, 1), cold, NETWORK)
    assert found.compute_seconds == pytest.approx(50 * (0.01 + resume))
    assert found.communication_seconds == pytest.approx(50 * reduce)  # the wait itself is unchanged
    server = predict(shape("downpour"), Layout(2, 1), cold, NETWORK)
    work, exchange = 0.01 - 0.001, 2 * ACROSS.seconds(999 * 4 + 64) + 0.001
    assert server.compute_seconds == pytest.approx(100 * (work + cold.resume(exchange)))
    # the server idles while the trainer works and its messages travel: its step after that pause is cold too
    assert server.communication_seconds == pytest.approx(100 * (exchange + cold.resume(work + exchange - 0.001)))
    one = predict(shape(), Layout(1, 1), cold, NETWORK)
    assert one.epoch_seconds == pytest.approx(100 * 0.01)  # no wait, nothing to pay


def test_an_asynchronous_server_saturates_and_its_updates_grow_stale():
    slow = compute(update_seconds=0.05)  # the server's step is 5x a trainer's compute
    found = predict(shape("downpour", rows=80_000), Layout(9, 1), slow, NETWORK)
    assert found.trainers == 8
    assert found.staleness == pytest.approx(7, abs=1e-6)  # every other trainer's update comes first
    per_update = found.epoch_seconds / found.steps / found.trainers
    assert per_update == pytest.approx(0.05, rel=0.01)  # the busiest station, the server's processor, sets the pace
    cold = compute(update_seconds=0.05, resume_seconds={0.001: 0.0002, 0.1: 0.004})
    busy = predict(shape("downpour", rows=80_000), Layout(9, 1), cold, NETWORK)
    assert busy.epoch_seconds == pytest.approx(found.epoch_seconds, rel=0.01)  # a busy server never goes cold


def test_a_plan_finds_the_crossover_and_recommends_the_smallest_cluster_near_the_fastest():
    profile = Profile(compute=compute(), network=NETWORK)
    plan = make_plan([shape("averaging", rows=1_000_000)], [1, 2, 4], 1, profile)
    one, two = plan.predictions[0], plan.predictions[1]
    crossing = plan.crossovers["averaging"][2]
    assert one.line.at(crossing) == pytest.approx(two.line.at(crossing))
    assert plan.speedup(two) == pytest.approx(one.job_seconds / two.job_seconds)
    assert plan.recommendation.startswith("4 node(s) x 1 worker(s), averaging, batch 100")
    assert rows_text(None) == "never" and rows_text(0.0) == "always" and rows_text(1234.2) == "1,235"


def test_a_link_bound_sync_job_is_told_one_machine():
    profile = Profile(compute=compute(), network=Network(across=Link(1e-3, 1e5), inside=INSIDE, source="test"))
    plan = make_plan([shape("sync", rows=1_000_000)], [1, 2], 1, profile)
    assert plan.recommendation.startswith("one machine: 1 node(s) x 1 worker(s), sync, batch 100: no layout of "
                                          "more machines is 1.2x as fast"), plan.recommendation
    assert plan.crossovers["sync"][2] is None


def test_easgd_is_a_server_unless_synchronous():
    server = predict(shape("easgd", rows=20_000), Layout(3, 1), compute(), NETWORK)
    collective = predict(shape("easgd", rows=20_000, options={"synchronous": True}), Layout(3, 1), compute(), NETWORK)
    assert (server.algorithm, server.trainers) == ("easgd (server)", 2)
    assert (collective.algorithm, collective.trainers) == ("easgd", 3)
    # the collective form: an all-reduce of the weights' differences every 4 steps
    reduce = 4 * (1e-3 + 999 * 4 / 3 / 1e6)
    assert collective.communication_seconds == pytest.approx(math.ceil(collective.steps / 4) * reduce)


def test_a_link_bound_cluster_is_told_a_batch_that_brings_communication_under_half_and_how_it_was_priced():
    """Sync on 4 nodes of a slow link: 6 x 3.5 = 21 ms of all-reduce to a 10 ms step, still 1.3x faster than one
    machine. Batch 400 takes communication under half; its step is priced on the line through the largest two
    timed, where the ladder stopped at 200."""
    slow = Network(across=Link(1e-3, 4e5), inside=INSIDE, source="test")
    plan = make_plan([shape("sync", rows=100_000)], [4], 1, Profile(compute=compute(), network=slow))
    assert plan.recommendation.endswith("batch 400 brings it under 50% (check the accuracy; its step priced "
                                        "beyond batch 200, the largest timed)"), plan.recommendation
    timed = compute(step_seconds={100: 0.01, 200: 0.02, 400: 0.04})
    plan = make_plan([shape("sync", rows=100_000)], [4], 1, Profile(compute=timed, network=slow))
    assert plan.recommendation.endswith("batch 400 brings it under 50% (check the accuracy)"), plan.recommendation


PERCEPTRON = ((40, 784), (40,), (10, 40), (10,))  # 31,810 parameters, 127 kB of gradients: one bucket


def test_a_sync_plan_that_waits_on_the_link_recommends_a_compression_with_each_ones_epoch():
    """2 nodes on 1 MB/s, 50 steps of 10 ms: exact sends 2 x 63.6 kB a step (0.129 s), bf16 half of it (0.066 s)
    after the row count's own all-reduce,
    powersgd 2 x 0.5 kB then 2 x 6.6 kB (0.018 s) and adds 4nmr + nr^2 multiply-adds at a step's rate per
    multiply-add (10 ms / (3 x 100 rows x 31,810))."""
    perceptron = shape("sync", parameters=31_810, parameter_shapes=PERCEPTRON)
    slow = Network(across=Link(1e-3, 1e6), inside=INSIDE, source="test")
    plan = make_plan([perceptron], [1, 2], 1, Profile(compute=compute(parameters=31_810), network=slow))
    exact = 50 * (0.01 + 2 * (1e-3 + 0.06362))
    half = 50 * (0.01 + 2 * (1e-3 + 0.03181) + 2 * (1e-3 + 4e-6))  # and the row count's own all-reduce
    multiply_adds = 4 * 40 * 784 * 4 + 40 * 16 + 4 * 10 * 40 * 4 + 10 * 16
    powersgd = 50 * (0.01 + multiply_adds * 0.01 / (3 * 100 * 31_810) + 2 * (1e-3 + 0.0005) + 2 * (1e-3 + 0.006592))
    assert plan.compression == (
        f"exact sync on 2 node(s) waits {exact - 0.5:.2f} s an epoch for the link against 0.50 s of compute: "
        f'algorithm.compression = "powersgd" would take {powersgd:.2f} s an epoch (bf16 {half:.2f} s, powersgd '
        f"{powersgd:.2f} s, exact {exact:.2f} s); powersgd changes the steps (check the accuracy), bf16 rounds the "
        "gradients to 8 significant bits")
    text = render(plan, Profile(machine={"host": "here"}, compute=compute(parameters=31_810), network=slow), 1)
    assert f"\ncompression: {plan.compression}" in text and plan.to_dict()["compression"] == plan.compression


def test_a_sync_plan_whose_compute_outlasts_the_exchange_recommends_no_compression():
    perceptron = shape("sync", parameters=31_810, parameter_shapes=PERCEPTRON)
    fast = Network(across=Link(1e-5, 1e9), inside=INSIDE, source="test")  # 84 µs a step against 10 ms of compute
    plan = make_plan([perceptron], [1, 2], 1, Profile(compute=compute(parameters=31_810), network=fast))
    assert plan.compression == ""
    text = render(plan, Profile(machine={"host": "here"}, compute=compute(parameters=31_810), network=fast), 1)
    assert "compression:" not in text


def test_averaging_and_easgd_rounds_are_priced_as_their_compression_sends_them():
    """Averaging once an epoch on 2 nodes at 1 MB/s, the perceptron's 127 kB of weights: exact a ring all-reduce of
    them; bf16 of half; powersgd (rank 4) of the P's (40 x 4 and 10 x 4) with the biases, then the Q's (784 x 4 and
    40 x 4). Synchronous EASGD's elastic round (every 4 steps) the same way."""
    def epoch(algorithm: str, compression: str, **options) -> float:
        found = predict(shape(algorithm, parameters=31_810, parameter_shapes=PERCEPTRON,
                              options={"compression": compression, **options}),
                        Layout(2, 1), compute(parameters=31_810), NETWORK)
        return found.communication_seconds

    def ring_of(size: float) -> float:
        return 2 * (1e-3 + size / 2 / 1e6)

    exact = ring_of(31_810 * 4)
    assert epoch("averaging", "none") == pytest.approx(exact)
    assert epoch("averaging", "bf16") == pytest.approx(ring_of(31_810 * 2))
    first, second = (4 * 40 + 40 + 4 * 10 + 10) * 4, (4 * 784 + 4 * 40) * 4
    assert epoch("averaging", "powersgd") == pytest.approx(ring_of(first) + ring_of(second))
    rounds = epoch("easgd", "none", synchronous=True) / exact  # every 4 of the epoch's 50 steps, and at its end
    assert rounds == pytest.approx(13)
    assert epoch("easgd", "powersgd", synchronous=True) == pytest.approx(rounds * (ring_of(first) + ring_of(second)))
