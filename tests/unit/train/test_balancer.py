"""cluster.balance on every rank: the Balancer's decisions from an epoch's figures, and a loader that follows them.

The figures are made by hand (a worker's rate is its rows over its compute and data seconds), so each
test knows the rates the balancer sees; the loader tests read a small dataset whose feature is the row's
number, so the batches tell which rows each worker trained on after its share moved.
"""

from __future__ import annotations

import io
from collections import Counter

import pytest
import torch

from shoal.data.balance import equal_plan, plan_from_shares, proportional, weighted_plan
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.errors import ConfigError
from shoal.train.balancer import SMOOTHING, TOLERANCE, Balancer, busiest, rate
from shoal.train.loop import EpochStats
from tests.support.shares import numbered

ROWS, BATCH, TRAINERS = 1200, 10, 3


def figures(shares, rates, seconds: float | None = None) -> list[EpochStats]:
    """Each worker's epoch at the given rate: its share's rows over compute and data seconds (half each); the
    epoch lasts `seconds` on every worker (the others wait for the slowest), by default the slowest's work."""
    length = max(rows / speed for rows, speed in zip(shares, rates)) if seconds is None else seconds
    return [EpochStats(rows=float(rows), compute=rows / speed / 2, data=rows / speed / 2, steps=1.0, seconds=length)
            for rows, speed in zip(shares, rates, strict=True)]


def minimum(balancer: Balancer) -> int:
    return balancer.plan.nominal if balancer.same_steps else 1


# ---------------------------------------------------------------- rates


def test_rate_is_rows_over_own_work_seconds():
    assert rate(EpochStats(rows=300.0, compute=2.0, data=1.0, communication=50.0)) == 100.0  # waiting excluded
    assert rate(EpochStats(rows=0.0, compute=2.0, data=1.0)) == 0.0
    assert rate(EpochStats(rows=10.0, compute=0.0, data=0.0)) == 0.0
    # rows a moved share re-read at the epoch's start count in its data time, not against its pace
    assert rate(EpochStats(rows=300.0, compute=2.0, data=4.0, reading=3.0)) == 100.0


# ---------------------------------------------------------------- equal and fixed


@pytest.mark.parametrize("same_steps", [True, False])
def test_equal_shares_never_move(same_steps):
    balancer = Balancer("equal", ROWS, TRAINERS, BATCH, same_steps)
    assert balancer.mode == "equal" and balancer.plan == equal_plan(ROWS, TRAINERS, BATCH)
    for rates in ([10.0, 1.0, 1.0], [1.0, 1.0, 50.0], [3.0, 2.0, 1.0]):
        assert balancer.observe(figures(balancer.plan.shares, rates)) is None
    assert balancer.plan == equal_plan(ROWS, TRAINERS, BATCH)
    balancer.load_state_dict({"shares": [600, 300, 300], "rates": [2.0, 1.0, 1.0]})  # another balance's checkpoint
    assert balancer.plan == equal_plan(ROWS, TRAINERS, BATCH)


@pytest.mark.parametrize("same_steps", [True, False])
def test_fixed_shares_follow_the_list_and_never_move(same_steps):
    balancer = Balancer([3, 1, 2], ROWS, TRAINERS, BATCH, same_steps)
    assert balancer.mode == "fixed"
    assert balancer.plan == weighted_plan(ROWS, [3.0, 1.0, 2.0], BATCH, same_steps)
    assert balancer.plan.shares == (600, 200, 400)
    assert balancer.observe(figures(balancer.plan.shares, [1.0, 5.0, 1.0])) is None
    assert balancer.plan.shares == (600, 200, 400)


@pytest.mark.parametrize("speeds", [[3, 1], [1, 1, 1, 1]])
def test_a_fixed_list_of_the_wrong_length_is_a_one_line_config_error(speeds):
    with pytest.raises(ConfigError) as caught:
        Balancer(speeds, ROWS, TRAINERS, BATCH, True)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cluster.balance:") and f"{len(speeds)} speeds" in message
    assert f"{TRAINERS} training workers" in message


# ---------------------------------------------------------------- speed


@pytest.mark.parametrize("same_steps", [True, False])
def test_speed_shares_move_after_the_first_epoch_towards_the_rates(same_steps):
    balancer = Balancer("speed", ROWS, TRAINERS, BATCH, same_steps)
    assert balancer.plan == weighted_plan(ROWS, [1.0] * TRAINERS, BATCH, same_steps)
    assert balancer.plan.shares == (400, 400, 400)
    moved = balancer.observe(figures(balancer.plan.shares, [2.0, 1.0, 1.0]))
    assert moved is not None and moved is balancer.plan
    assert balancer.rates == [2.0, 1.0, 1.0]
    assert moved == plan_from_shares([600, 300, 300], BATCH, same_steps)  # the faster worker takes twice the rows
    if same_steps:
        assert moved.steps == (moved.nominal,) * TRAINERS == (40,) * TRAINERS
        assert moved.largest_batch(0) == 15 and moved.largest_batch(1) == 8
    else:
        assert moved.steps == (60, 30, 30)
    assert balancer.observe(figures(moved.shares, [2.0, 1.0, 1.0])) is None  # there already: no move


def drop_to(fraction: float) -> list[float]:
    """Rates [1, 1, x] that would shorten an epoch of equal shares by about `fraction` once shares follow them.

    Equal shares take ROWS / 3 seconds at rate 1; shares that follow the rates take ROWS / (2 + x)."""
    return [1.0, 1.0, 3 / (1 - fraction) - 2]


@pytest.mark.parametrize("same_steps", [True, False])
def test_shares_do_not_move_when_the_epoch_would_shorten_by_less_than_the_tolerance(same_steps):
    balancer = Balancer("speed", ROWS, TRAINERS, BATCH, same_steps)
    before = balancer.plan
    rates = drop_to(TOLERANCE / 2)
    target = proportional(ROWS, rates, minimum(balancer))
    assert target != list(before.shares)  # the rates do call for other shares ...
    assert busiest(target, rates) > (1 - TOLERANCE) * busiest(list(before.shares), rates)  # ... but barely
    assert balancer.observe(figures(before.shares, rates)) is None
    assert balancer.plan is before
    assert balancer.rates == pytest.approx(rates)  # the figure is kept all the same


@pytest.mark.parametrize("same_steps", [True, False])
def test_shares_move_when_the_epoch_would_shorten_by_more_than_the_tolerance(same_steps):
    balancer = Balancer("speed", ROWS, TRAINERS, BATCH, same_steps)
    rates = drop_to(2 * TOLERANCE)
    moved = balancer.observe(figures(balancer.plan.shares, rates))
    assert moved is not None
    assert list(moved.shares) == proportional(ROWS, rates, minimum(balancer))
    assert moved.shares[2] > moved.shares[0] == moved.shares[1]


@pytest.mark.parametrize("same_steps", [True, False])
def test_the_moving_rate_weighs_the_newest_epoch_by_the_smoothing(same_steps):
    balancer = Balancer("speed", ROWS, TRAINERS, BATCH, same_steps)
    balancer.observe(figures(balancer.plan.shares, [2.0, 1.0, 1.0]))
    old, new = [2.0, 1.0, 1.0], [1.0, 1.0, 1.0]
    expected = [SMOOTHING * n + (1 - SMOOTHING) * o for n, o in zip(new, old)]
    assert expected != new and expected != old  # a moving figure, neither the old nor the newest
    shares = list(balancer.plan.shares)
    moved = balancer.observe(figures(shares, new, seconds=300.0))  # shorter than the 400 s before: the move stays
    assert balancer.rates == pytest.approx(expected, rel=1e-12)
    target = proportional(ROWS, expected, minimum(balancer))
    assert busiest(target, expected) < (1 - TOLERANCE) * busiest(shares, expected)  # far enough to move
    assert moved is not None and list(moved.shares) == target


def test_a_worker_that_measured_no_rows_is_not_followed():
    balancer = Balancer("speed", ROWS, TRAINERS, BATCH, True)
    before = balancer.plan
    nothing = figures(before.shares, [2.0, 1.0, 1.0])
    nothing[2] = EpochStats(rows=0.0, compute=0.0, data=0.0)
    assert balancer.observe(nothing) is None  # no rate for worker 2: nothing to follow, and no division by zero
    assert balancer.plan is before
    moved = balancer.observe(figures(before.shares, [2.0, 1.0, 1.0]))  # all measured: the shares follow
    assert moved is not None and moved.shares == (600, 300, 300)
    later = figures(moved.shares, [2.0, 1.0, 1.0])
    later[1] = EpochStats(rows=0.0, compute=1.0, data=0.0)
    assert balancer.observe(later) is None
    assert balancer.rates == pytest.approx([2.0, 1.0, 1.0])  # worker 1 keeps its figure


# ---------------------------------------------------------------- checkpoints


def through_a_checkpoint(state: dict) -> dict:
    """The state as a rank file gives it back: torch.save, then torch.load(weights_only=True)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("same_steps", [True, False])
def test_a_checkpoint_restores_the_shares_and_rates_exactly(same_steps):
    balancer = Balancer("speed", ROWS, TRAINERS, BATCH, same_steps)
    balancer.observe(figures(balancer.plan.shares, [2.1, 1.0, 0.9]))
    balancer.observe(figures(balancer.plan.shares, [1.7, 1.3, 0.7]))
    assert balancer.plan.shares != (400, 400, 400)

    resumed = Balancer("speed", ROWS, TRAINERS, BATCH, same_steps)
    resumed.load_state_dict(through_a_checkpoint(balancer.state_dict()))
    assert resumed.plan == balancer.plan
    assert resumed.rates == balancer.rates  # exactly: the same floats
    later = [1.1, 1.9, 0.8]  # and both decide the next epoch alike
    assert resumed.observe(figures(resumed.plan.shares, later)) == balancer.observe(figures(balancer.plan.shares,
                                                                                            later))
    assert resumed.plan == balancer.plan and resumed.rates == balancer.rates


def test_a_checkpoint_without_shares_keeps_the_first_plan():
    balancer = Balancer("speed", ROWS, TRAINERS, BATCH, True)
    before = balancer.plan
    balancer.load_state_dict(None)
    balancer.load_state_dict({})
    assert balancer.plan is before and balancer.rates is None


def test_a_fixed_checkpoint_round_trips():
    balancer = Balancer([3, 1, 2], ROWS, TRAINERS, BATCH, False)
    resumed = Balancer([3, 1, 2], ROWS, TRAINERS, BATCH, False)
    resumed.load_state_dict(through_a_checkpoint(balancer.state_dict()))
    assert resumed.plan == balancer.plan and resumed.rates is None


# ---------------------------------------------------------------- a loader following the shares

LOADER_ROWS, LOADER_BATCH, FEATURES = 400, 5, 16  # 64 bytes a row
CACHE_BUDGET = 6000  # below every share's size here (400 rows: 200 -> 14,400 bytes, 100 -> 7,200)


@pytest.fixture(scope="module")
def numbered_path(tmp_path_factory) -> str:
    return numbered(tmp_path_factory.mktemp("data") / "numbered", LOADER_ROWS, FEATURES)


def open_loaders(path: str, budget: int | None) -> tuple[list[ShardLoader], list[list[tuple[int, int]]]]:
    """Two training workers on equal shares; each one's reads from the dataset are recorded."""
    loaders, reads = [], []
    for worker in range(2):
        dataset = open_dataset(path)
        recorded: list[tuple[int, int]] = []
        read_rows = dataset.read_rows

        def recording(start, stop, read_rows=read_rows, recorded=recorded):
            recorded.append((start, stop))
            return read_rows(start, stop)

        dataset.read_rows = recording
        loaders.append(ShardLoader(dataset, rank=worker, world_size=2, batch_size=LOADER_BATCH, seed=7,
                                   memory_budget=budget))
        reads.append(recorded)
    return loaders, reads


def rows_and_batches(loader: ShardLoader, epoch: int) -> tuple[list[int], list[int]]:
    batches = [inputs[:, 0].to(torch.int64).tolist() for inputs, _ in loader.batches(epoch)]
    return [row for batch in batches for row in batch], [len(batch) for batch in batches]


def check_following(loaders: list[ShardLoader], plan, epoch: int) -> None:
    """Every row exactly once across the workers, each worker on its range and in its plan's batches."""
    seen = []
    for worker, loader in enumerate(loaders):
        rows, sizes = rows_and_batches(loader, epoch)
        start, stop = plan.range(worker)
        assert sorted(rows) == list(range(start, stop))
        assert sizes == [hi - lo for lo, hi in plan.bounds(worker)]
        assert loader.steps == plan.steps[worker] == len(sizes)
        seen += rows
    assert Counter(seen) == Counter(range(LOADER_ROWS))


@pytest.mark.parametrize("same_steps", [True, False])
def test_a_moved_share_in_memory_reads_only_the_rows_it_adds(numbered_path, same_steps):
    loaders, reads = open_loaders(numbered_path, None)
    try:
        assert [loader.describe()["mode"] for loader in loaders] == ["memory", "memory"]
        assert reads == [[(0, 200)], [(200, 400)]]
        check_following(loaders, equal_plan(LOADER_ROWS, 2, LOADER_BATCH), 0)
        plan = weighted_plan(LOADER_ROWS, [3.0, 1.0], LOADER_BATCH, same_steps)
        assert plan.shares == (300, 100)
        for loader, recorded in zip(loaders, reads):
            recorded.clear()
            loader.reshare(plan)
        assert reads == [[(200, 300)], []]  # worker 0 reads the rows it gains; worker 1 keeps part of what it held
        check_following(loaders, plan, 1)
        back = equal_plan(LOADER_ROWS, 2, LOADER_BATCH)
        for loader, recorded in zip(loaders, reads):
            recorded.clear()
            loader.reshare(back)
        assert reads == [[], [(200, 300)]]
        check_following(loaders, back, 2)
        assert [loader.reshare(back) for loader in loaders] == [0.0, 0.0]  # the same plan: nothing to do
        assert reads == [[], [(200, 300)]]
    finally:
        for loader in loaders:
            loader.close()


@pytest.mark.parametrize("same_steps", [True, False])
def test_a_moved_share_in_the_local_cache_is_cached_anew(numbered_path, same_steps):
    loaders, _ = open_loaders(numbered_path, CACHE_BUDGET)
    try:
        assert [loader.describe()["mode"] for loader in loaders] == ["cache", "cache"]
        check_following(loaders, equal_plan(LOADER_ROWS, 2, LOADER_BATCH), 0)
        plan = weighted_plan(LOADER_ROWS, [3.0, 1.0], LOADER_BATCH, same_steps)
        for loader in loaders:
            loader.reshare(plan)
        assert [loader.describe()["mode"] for loader in loaders] == ["cache", "cache"]
        assert [loader.rows for loader in loaders] == [300, 100]
        assert all(loader.describe()["sub_partitions"] > 1 for loader in loaders)
        for epoch in (1, 2):  # shuffled differently each epoch, every row still once
            check_following(loaders, plan, epoch)
    finally:
        for loader in loaders:
            loader.close()


def test_a_share_that_shrinks_below_the_budget_moves_from_the_cache_to_memory(numbered_path):
    budget = 100 * (FEATURES * 4 + 8)  # a share of 100 rows fits, one of 200 does not
    loaders, _ = open_loaders(numbered_path, budget)
    try:
        plan = weighted_plan(LOADER_ROWS, [3.0, 1.0], LOADER_BATCH, False)
        assert plan.shares == (300, 100)
        assert [loader.describe()["mode"] for loader in loaders] == ["cache", "cache"]
        for loader in loaders:
            loader.reshare(plan)
        assert [loader.describe()["mode"] for loader in loaders] == ["cache", "memory"]
        check_following(loaders, plan, 1)
    finally:
        for loader in loaders:
            loader.close()


def test_a_budget_that_cannot_hold_a_moved_share_is_refused_before_training(numbered_path):
    """Speed shares may give one worker nearly every row: a budget fit for equal shares only fails at launch,
    in one line naming cluster.balance, not at the epoch's end where the shares move."""
    from shoal.jobs import from_dict
    from shoal.train.prepare import check_world_size

    def job(balance):
        return from_dict({
            "model": {"layers": [{"dense": 2}]}, "data": {"train": numbered_path, "memory_per_worker": 3_000},
            "algorithm": {"name": "sync"}, "train": {"batch_size": 5}, "cluster": {"balance": balance}})

    dataset = open_dataset(numbered_path)
    check_world_size(job("equal"), 2, dataset)  # an equal share fits
    with pytest.raises(ConfigError, match=r"^cluster.balance: 'speed' may give one worker up to all"):
        check_world_size(job("speed"), 2, dataset)
