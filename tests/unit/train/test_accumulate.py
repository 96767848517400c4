"""train.accumulate and train.precision: cNeural's batch mode is one full-share gradient step per epoch,
N-batch groups on two ranks, bf16 trains near fp32, and what each refuses."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.cluster.fake import run_ranks
from shoal.data.format import open_dataset
from shoal.errors import ConfigError
from shoal.jobs import from_dict
from shoal.model import build_model
from shoal.train.prepare import prepare
from shoal.train.runner import Runner
from tests.distributed.common import write_dataset
from tests.unit.train.test_runner import job, weights

LAYERS = [{"dense": 8, "activation": "tanh"}, {"dense": 3}]


def batch_mode_job(tmp_path, epochs: int, **train):
    train_set = tmp_path / "train"
    if not train_set.exists():
        write_dataset(str(train_set), rows=96, seed=1)
    return from_dict({
        "model": {"layers": LAYERS},
        "data": {"train": str(train_set)},
        "algorithm": {"name": "sync"},
        "train": {"epochs": epochs, "batch_size": 10, "optimizer": {"name": "sgd", "lr": 0.5}, **train},
        "output": {"progress": "none"},
        "checkpoint": {"every": 0},
    }, name="batch-mode")


def on_two_ranks(config, run_dir, start: dict | None = None) -> dict:
    """The job's steps on two fake ranks (threads); the initial weights. Threads share torch's seeded
    generator, so rank 0's weights are sent to rank 1 after set-up, as separate processes would have them."""
    run_dir.mkdir()
    initial = {}

    def rank(comm):
        runner = Runner(config, DistInfo(rank=comm.rank, world_size=2, host="host-a"), run_dir, threads=1,
                        comm=comm)
        try:
            runner.setup()
            if start is not None:
                runner.model.load_state_dict(start)
            with torch.no_grad():
                for parameter in runner.model.parameters():
                    comm.broadcast_(parameter.data, 0)
            if comm.rank == 0:
                initial.update({name: tensor.clone() for name, tensor in runner.model.state_dict().items()})
            runner.load_data()
            runner.resume()
            runner.start()
            for epoch in range(config.train.epochs):
                runner.end_epoch(epoch, runner.run_epoch(epoch))
            runner.complete()
        finally:
            runner.finish()

    run_ranks(2, rank, timeout=60)
    return initial


def full_share_steps(tmp_path, initial: dict, epochs: int) -> dict:
    """From `initial`, per epoch one step down the mean gradient over all 96 rows, by hand."""
    model = build_model({"input": [open_dataset(str(tmp_path / "train")).features], "layers": LAYERS})
    model.load_state_dict(initial)
    features, labels = open_dataset(str(tmp_path / "train")).read_all()
    inputs, targets = torch.from_numpy(features), torch.from_numpy(labels).long()
    for _ in range(epochs):
        model.zero_grad()
        functional.cross_entropy(model(inputs), targets).backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= 0.5 * parameter.grad
    return model.state_dict()


def test_accumulating_an_epoch_on_two_ranks_is_the_full_share_gradient_step(tmp_path):
    initial = on_two_ranks(batch_mode_job(tmp_path, epochs=2, accumulate="epoch"), tmp_path / "run")
    by_hand = full_share_steps(tmp_path, initial, epochs=2)
    trained = weights(tmp_path / "run")  # 48 rows per rank in batches of 10: 5 batches, one update
    for name, tensor in by_hand.items():
        assert torch.allclose(trained[name], tensor, atol=1e-6), name
    assert not torch.allclose(trained["0.weight"], full_share_steps(tmp_path, initial, epochs=1)["0.weight"], atol=1e-4)


def test_groups_of_batches_equal_larger_batches(tmp_path):
    """Two batches of 8 summed make one step as a batch of 16 does, the short last batch included."""
    grouped, large = tmp_path / "grouped", tmp_path / "large"
    initial = on_two_ranks(batch_mode_job(tmp_path, epochs=1, accumulate=2, batch_size=8, shuffle=False), grouped)
    on_two_ranks(batch_mode_job(tmp_path, epochs=1, batch_size=16, shuffle=False), large, start=initial)
    for name, tensor in weights(large).items():
        assert torch.allclose(weights(grouped)[name], tensor, atol=1e-6), name


def test_bf16_trains_within_reach_of_fp32(tmp_path):
    results = {}
    for precision in ("fp32", "bf16"):
        run_dir = tmp_path / precision
        run_dir.mkdir()
        results[precision] = Runner(job(tmp_path, precision=precision), DistInfo(), run_dir, threads=1,
                                    comm=Communicator(0, 1)).run()
    assert results["bf16"]["loss"] == pytest.approx(results["fp32"]["loss"], rel=0.05)
    assert results["bf16"] != results["fp32"]  # autocast really ran in bf16


@pytest.mark.parametrize("train, algorithm, message", [
    ({"accumulate": 0}, "sync", "train.accumulate: must be an integer >= 1"),
    ({"accumulate": "all"}, "sync", "train.accumulate: must be an integer >= 1"),
    ({"accumulate": 2}, "averaging", "train.accumulate: sums gradients before one exchange"),
    ({"precision": "fp16"}, "sync", "train.precision: must be one of fp32, bf16"),
])
def test_bad_settings_are_one_line(tmp_path, train, algorithm, message):
    with pytest.raises(ConfigError, match=message) as raised:
        config = job(tmp_path, **train)
        config.algorithm.name, config.algorithm.options = algorithm, {}
        prepare(config)
    assert "\n" not in str(raised.value)
