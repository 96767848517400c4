"""Synchronous SGD's bucketed exchange: overlapped with the backward pass or not, through the machines' first
workers or flat, N workers still take one worker's steps on the global batch; a parameter a batch does not use
neither hangs the exchange nor is lost; only the wait after the backward pass counts as communication.
Ranks are threads of the fake communicator, driven by the real training loop: no processes.
"""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch
from torch import nn
from torch.nn import functional

from shoal.algorithms.exchange import ExchangeThread
from shoal.algorithms.sync import SynchronousSGD, SyncOptions
from shoal.cluster.fake import FakeCommunicator, run_ranks
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.errors import ConfigError
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, FEATURES, parameters, rank_batches, write_dataset

ROWS, BATCH, SEED, EPOCHS = 70, 8, 5, 2  # 2 ranks: 35 rows each, 5 steps, the last of 3 rows
BUCKET_MB = 0.0003  # 314 bytes: the model below in 3 buckets
SEEDING = threading.Lock()  # ranks are threads: model construction seeds the global generator


class Branchy(nn.Module):
    """An MLP with a second head that some batches skip: `uses[i]` says whether forward call i uses it."""

    def __init__(self, uses: list[bool] | None = None):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
        self.extra = nn.Linear(16, CLASSES)
        self.head = nn.Linear(16, CLASSES)
        self.uses, self.calls = uses, 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        used = self.uses is None or self.uses[self.calls % len(self.uses)]
        self.calls += 1
        return self.run(inputs, used)

    def run(self, inputs: torch.Tensor, used: bool) -> torch.Tensor:
        hidden = self.trunk(inputs)
        return self.head(hidden) + self.extra(hidden) if used else self.head(hidden)


def new_model(uses=None) -> Branchy:
    with SEEDING:
        torch.manual_seed(0)
        return Branchy(uses)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("sync") / "data", rows=ROWS, seed=3)


def build(comm, path: str, options: SyncOptions, *, accumulate=None, uses=None, machines=None, momentum=0.9,
          model=None) -> Trainer:
    """A rank's model, optimizer, sync algorithm (set up) and the training loop around them."""
    model = model if model is not None else new_model(uses[comm.rank] if uses else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    algorithm = SynchronousSGD(options)
    algorithm.machines = machines
    algorithm.setup(model, optimizer, comm)
    loader = ShardLoader(open_dataset(path), rank=comm.rank, world_size=comm.world_size, batch_size=BATCH, seed=SEED)
    return Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm,
                   accumulate=accumulate)


def train_rank(comm, path: str, options: SyncOptions, *, epochs=EPOCHS, **settings) -> dict:
    """`epochs` epochs of sync on this rank through the Trainer; what the tests look at."""
    trainer = build(comm, path, options, **settings)
    stats = [trainer.train_epoch(epoch) for epoch in range(epochs)]
    return {"parameters": parameters(trainer.model), "stats": stats, "report": trainer.algorithm.epoch_report(),
            "algorithm": trainer.algorithm, "comm": comm}


def one_worker(path: str, world_size: int, *, accumulate=None, uses=None, momentum=0.9) -> list[torch.Tensor]:
    """One model taking each step on the concatenation of the workers' batches (a group of `accumulate` steps:
    one step on all of them), each rank's rows through the branch that rank's forward call took."""
    features, labels = open_dataset(path).read_all()
    model = new_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    calls = 0
    for epoch in range(EPOCHS):
        steps = rank_batches(path, world_size, BATCH, SEED, epoch)
        size = accumulate or 1
        for start in range(0, len(steps), size):
            group = steps[start : start + size]
            optimizer.zero_grad(set_to_none=True)
            loss, total = 0.0, sum(len(rows) for step in group for rows in step)
            for offset, step in enumerate(group):
                for rank, rows in enumerate(step):
                    used = uses is None or uses[rank][(calls + offset) % len(uses[rank])]
                    outputs = model.run(torch.from_numpy(features[rows]), used)
                    loss = loss + functional.cross_entropy(outputs, torch.from_numpy(labels[rows]).long(),
                                                           reduction="sum")
            (loss / total).backward()
            optimizer.step()
            calls += len(group)
    return parameters(model)


def assert_ranks_equal(results: list[dict]) -> None:
    for result in results[1:]:
        for mine, first in zip(result["parameters"], results[0]["parameters"], strict=True):
            assert torch.equal(mine, first)


def assert_near(actual: list[torch.Tensor], expected: list[torch.Tensor], rtol=1e-5, atol=1e-6) -> None:
    for mine, reference in zip(actual, expected, strict=True):
        torch.testing.assert_close(mine, reference, rtol=rtol, atol=atol)


@pytest.mark.parametrize("accumulate", [None, 2])
def test_workers_equal_one_worker_on_the_global_batch(dataset, accumulate):
    runs = {overlap: run_ranks(2, lambda comm, overlap=overlap: train_rank(
        comm, dataset, SyncOptions(bucket_mb=BUCKET_MB, overlap=overlap), accumulate=accumulate), timeout=20)
        for overlap in (True, False)}
    expected = one_worker(dataset, 2, accumulate=accumulate)
    for results in runs.values():
        assert len(results[0]["algorithm"].exchange.buckets) == 3
        assert_ranks_equal(results)
        assert_near(results[0]["parameters"], expected)
    # an ulp apart: the overlapped exchange scales each gradient by its rows then divides by all ranks' rows, the
    # other (which knows the total before it fills the buckets) scales by their ratio in one step
    assert_near(runs[True][0]["parameters"], runs[False][0]["parameters"], rtol=1e-6, atol=1e-7)
    assert runs[True][0]["algorithm"].exchange.hooks and not runs[False][0]["algorithm"].exchange.hooks


# Per rank, whether each forward call (5 an epoch) uses the second head: on call 1 no rank does; with groups of
# 2 batches, rank 0 uses it in the first batch of a group and not in the last, rank 1 in no batch of group 0.
USES = [[True, False, True, False, True], [False, False, True, True, False]]


@pytest.mark.parametrize("accumulate", [None, 2])
@pytest.mark.parametrize("overlap", [True, False])
def test_a_parameter_a_batch_does_not_use_counts_as_zeros(dataset, accumulate, overlap):
    """No hang waiting for its gradient; where no rank used it, no update (plain SGD: a zero gradient moves
    nothing), and a gradient summed in earlier batches of a group still counts."""
    results = run_ranks(2, lambda comm: train_rank(comm, dataset, SyncOptions(bucket_mb=BUCKET_MB, overlap=overlap),
                                                   accumulate=accumulate, uses=USES, momentum=0.0), timeout=20)
    assert_ranks_equal(results)
    assert_near(results[0]["parameters"], one_worker(dataset, 2, accumulate=accumulate, uses=USES, momentum=0.0))
    untrained = parameters(new_model())
    assert not torch.equal(results[0]["parameters"][4], untrained[4])  # the second head trained when used


@pytest.mark.parametrize("machines", [[[0, 1], [2, 3]], [[0, 1, 2], [3]], [[0], [1], [2], [3]]])
def test_hierarchical_route_equals_the_flat_route(dataset, machines):
    flat = run_ranks(4, lambda comm: train_rank(comm, dataset, SyncOptions(bucket_mb=BUCKET_MB, hierarchical=False),
                                                machines=machines), timeout=20)
    layered = run_ranks(4, lambda comm: train_rank(comm, dataset, SyncOptions(bucket_mb=BUCKET_MB),
                                                   machines=machines), timeout=20)
    routes = [result["algorithm"].exchange.route for result in layered]
    assert all(route.inside is None for route in routes) == (len(machines) == 4)  # one worker a machine: flat
    assert all(result["algorithm"].exchange.route.inside is None for result in flat)
    assert_ranks_equal(flat)
    assert_ranks_equal(layered)
    assert_near(layered[0]["parameters"], flat[0]["parameters"])
    assert_near(flat[0]["parameters"], one_worker(dataset, 4))


def test_hierarchical_powersgd_keeps_every_rank_equal(dataset):
    results = run_ranks(4, lambda comm: train_rank(comm, dataset, SyncOptions(compression="powersgd",
                                                                              bucket_mb=BUCKET_MB),
                                                   machines=[[0, 1], [2, 3]]), timeout=20)
    assert_ranks_equal(results)
    # only the machines' first workers compress (what crosses machines); the others receive the broadcast
    errors = [sorted(result["algorithm"].compressor.errors) for result in results]
    assert errors[0] == errors[2] and errors[0] and errors[1] == errors[3] == []
    assert results[0]["report"]["compression"] == "powersgd"
    assert not torch.equal(results[0]["parameters"][0], parameters(new_model())[0])


# How far each compression's weights end from exact sync's after 2 epochs (10 steps, weights moved by up to 0.19):
# none a few ulps; bf16 and fp16 round the summed gradients once a step (measured 5e-4 and 1.5e-4); PowerSGD sends
# a rank-4 approximation, the rest a step or more later (measured 8e-3).
@pytest.mark.parametrize("compression, tolerance", [("none", 1e-6), ("bf16", 2e-3), ("fp16", 5e-4),
                                                    ("powersgd", 3e-2)])
def test_every_compression_keeps_the_ranks_equal_and_reports_its_exchange(dataset, compression, tolerance):
    results = run_ranks(2, lambda comm: train_rank(comm, dataset, SyncOptions(compression=compression,
                                                                              bucket_mb=BUCKET_MB)), timeout=20)
    assert_ranks_equal(results)
    exact = one_worker(dataset, 2)
    assert_near(results[0]["parameters"], exact, rtol=0, atol=tolerance)
    if compression != "none":  # it did compress
        assert any(not torch.allclose(mine, reference, rtol=0, atol=1e-5)
                   for mine, reference in zip(results[0]["parameters"], exact))
    for result in results:
        report = result["report"]
        assert report["compression"] == compression and report["buckets"] == 3
        assert report["exchange_seconds"] >= report["hidden_seconds"] >= 0
        assert report["exchange_seconds"] > 0


def test_one_worker_has_no_exchange(dataset):
    (result,) = run_ranks(1, lambda comm: train_rank(comm, dataset, SyncOptions(compression="powersgd")))
    assert result["algorithm"].exchange is None and result["report"] == {}
    assert all(stats.communication == 0 for stats in result["stats"])
    assert_near(result["parameters"], one_worker(dataset, 1))


def resume_rank(comm, path: str, saved: list[dict] | None, keep_algorithm: bool = True, bucket_mb=BUCKET_MB):
    """Epoch 0 then epoch 1, saving each rank's state between them; or, given that state, epoch 1 from it."""
    trainer = build(comm, path, SyncOptions(compression="powersgd", bucket_mb=bucket_mb, overlap=False))
    model, optimizer, algorithm = trainer.model, trainer.optimizer, trainer.algorithm
    if saved is None:
        trainer.train_epoch(0)
        state = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                               "algorithm": algorithm.state_dict()})
    else:
        state = copy.deepcopy(saved[comm.rank])  # the optimizer keeps the tensors it loads, and moves them on
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if keep_algorithm:
            algorithm.load_state_dict(state["algorithm"])
    trainer.train_epoch(1)
    return state, parameters(model)


def test_a_resume_with_powersgd_continues_bit_for_bit(dataset):
    first = run_ranks(2, lambda comm: resume_rank(comm, dataset, None), timeout=20)
    saved = [state for state, _ in first]
    # the compressed matrices (the trunk's two weights, parameters 0 and 2 of the model) and each rank's own errors
    errors = [state["algorithm"]["compression"]["errors"] for state in saved]
    assert sorted(errors[0]) == sorted(errors[1]) == ["p0", "p2"]
    assert not torch.equal(errors[0]["p0"], errors[1]["p0"])
    resumed = run_ranks(2, lambda comm: resume_rank(comm, dataset, saved), timeout=20)
    for (_, straight), (_, again) in zip(first, resumed):
        assert all(torch.equal(a, b) for a, b in zip(straight, again))
    # the state is kept per parameter, not per bucket: cut into one bucket instead of three, each matrix takes up
    # its own Q and error, and the steps are the same
    one_bucket = run_ranks(2, lambda comm: resume_rank(comm, dataset, saved, bucket_mb=1.0), timeout=20)
    for (_, straight), (_, again) in zip(first, one_bucket):
        assert all(torch.equal(a, b) for a, b in zip(straight, again))
    forgetful = run_ranks(2, lambda comm: resume_rank(comm, dataset, saved, keep_algorithm=False), timeout=20)
    assert not all(torch.equal(a, b) for a, b in zip(first[0][1], forgetful[0][1]))  # the state mattered


@pytest.mark.parametrize("options, key", [
    ({"compression": "topk"}, "algorithm.compression"),
    ({"compression": None}, "algorithm.compression"),
    ({"compression_rank": 0}, "algorithm.compression_rank"),
    ({"compression_rank": True}, "algorithm.compression_rank"),
    ({"compression_rank": 2.5}, "algorithm.compression_rank"),
    ({"bucket_mb": 0}, "algorithm.bucket_mb"),
    ({"bucket_mb": -1.0}, "algorithm.bucket_mb"),
    ({"bucket_mb": True}, "algorithm.bucket_mb"),
    ({"bucket_mb": "4"}, "algorithm.bucket_mb"),
    ({"overlap": "yes"}, "algorithm.overlap"),
    ({"overlap": 1}, "algorithm.overlap"),
    ({"hierarchical": 0}, "algorithm.hierarchical"),
])
def test_bad_options_name_the_key(options, key):
    with pytest.raises(ConfigError, match=rf"^{key}: ") as raised:
        SyncOptions(**options)
    assert "\n" not in str(raised.value)


def test_good_options_are_kept():
    options = SyncOptions(compression="powersgd", compression_rank=2, overlap=False, bucket_mb=0.5,
                          hierarchical=False)
    assert (options.compression, options.compression_rank, options.overlap, options.bucket_mb) == \
        ("powersgd", 2, False, 0.5)
    assert SyncOptions(bucket_mb=1).bucket_mb == 1


# --- what counts as communication

DELAY = 0.01  # seconds each all-reduce of gradients takes on the slow link below


class SlowLink(FakeCommunicator):
    """A fake communicator whose all-reduces take DELAY seconds more (counted as communication): a slow link."""

    def _exchange(self, operation: str, value) -> list:
        if operation == "all_reduce_sum_":
            start = time.perf_counter()
            time.sleep(DELAY)
            self._count(start)
        return super()._exchange(operation, value)

    def detached(self) -> SlowLink:
        return SlowLink(self.group, self.rank, self.device)


class SlowBackward(torch.autograd.Function):
    """The identity whose backward pass takes 4 x DELAY: a layer with a long backward below the last one."""

    @staticmethod
    def forward(context, inputs):
        return inputs.view_as(inputs)

    @staticmethod
    def backward(context, gradient):
        ORDER.setdefault(threading.get_ident(), []).append("slow backward")
        time.sleep(4 * DELAY)
        return gradient


ORDER: dict[int, list[str]] = {}
"""What each rank's training thread did, in order: entered SlowBackward's backward, or handed the exchange's thread
a job (the rows or a bucket)."""


def recorded(submit):
    """ExchangeThread.submit, noting each hand-over on the calling thread's list in ORDER."""
    def submitting(self, function, *args):
        ORDER.setdefault(threading.get_ident(), []).append("handed over")
        return submit(self, function, *args)
    return submitting


class SlowMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.last = nn.Linear(FEATURES, 16), nn.Linear(16, CLASSES)

    def forward(self, inputs):
        return self.last(torch.tanh(SlowBackward.apply(self.first(inputs))))


def slow_rank(comm, path: str, overlap: bool) -> dict:
    with SEEDING:
        torch.manual_seed(0)
        model = SlowMLP()
    link = SlowLink(comm.group, comm.rank)
    # a bucket a parameter: the last layer's two go out while the first layer's backward pass runs
    result = train_rank(link, path, SyncOptions(bucket_mb=1e-6, overlap=overlap), model=model, epochs=1)
    result["route"] = result["algorithm"].exchange.route.seconds()
    result["order"] = ORDER.get(threading.get_ident(), [])
    return result


@pytest.mark.parametrize("overlap", [True, False])
def test_only_the_wait_after_the_backward_pass_is_communication(dataset, overlap, monkeypatch):
    """Overlapped, each step exchanges the rows and 4 buckets (5 x DELAY on the exchange's clock), and the rows
    and the last layer's 2 buckets go during the first layer's backward pass (4 x DELAY), so the loop waits for
    about 2 of the 5 (asserted as the order in which the buckets go out: the share hidden depends on the machine's
    load); not overlapped, the rows ride in the first bucket and the loop waits for the 4 buckets."""
    ORDER.clear()
    monkeypatch.setattr(ExchangeThread, "submit", recorded(ExchangeThread.submit))
    results = run_ranks(2, lambda comm: slow_rank(comm, dataset, overlap), timeout=20)
    assert_ranks_equal(results)
    for result in results:
        (stats,), report, exchange = result["stats"], result["report"], result["algorithm"].exchange
        assert len(exchange.buckets) == 4
        assert report["exchange_seconds"] >= (5 if overlap else 4) * 5 * DELAY  # 5 steps
        assert report["exchange_seconds"] == pytest.approx(result["route"], abs=1e-3)
        assert stats.communication >= exchange.waited  # the loop's communication: the waits, and the epoch's end
        if overlap:
            assert result["comm"].seconds <= result["route"]
            # each step, the rows and the last layer's 2 buckets went to the exchange's thread before the first
            # layer's slow backward began, the first layer's 2 after it: an order no load changes (how much of the
            # exchange that hides is a timing, benchmarks/comm.py's to measure)
            step = ["handed over"] * 3 + ["slow backward"] + ["handed over"] * 2
            assert result["order"] == step * 5  # 5 steps
            assert report["hidden_seconds"] >= 0  # max(0, exchange - wait) by construction, whatever the load
        else:  # all of it after the backward pass: nothing hidden
            assert result["order"] == ["slow backward"] * 5  # no thread: nothing handed over
            assert stats.communication >= 4 * 5 * DELAY
            assert report["hidden_seconds"] == 0


def test_fp16_keeps_a_mean_gradient_of_many_rows_in_range():
    """The exchange divides each bucket by every rank's rows before the sum: 30,037 rows a rank of a mean gradient
    of 1.5 would be 45,056 x 2 = 90,112 as a rows-weighted sum, beyond fp16's 65,504; as a mean it is 1.5."""

    def rank(comm):
        model = nn.Linear(4, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(0.0)
        algorithm = SynchronousSGD(SyncOptions(compression="fp16"))
        algorithm.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), comm)
        rows = 30_037
        algorithm.before_backward(float(rows), rows, True)
        model.weight.grad = None
        (model(torch.ones(1, 4)).sum() + 1.5 * model.weight.sum() - model(torch.ones(1, 4)).sum()).backward()
        algorithm.after_backward(rows)
        return model.weight.grad.clone()

    results = run_ranks(2, rank, timeout=20)
    assert torch.equal(results[0], results[1])
    assert torch.equal(results[0], torch.full((1, 4), 1.5))
