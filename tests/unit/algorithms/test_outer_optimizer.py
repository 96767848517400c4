"""algorithm.outer: DiLoCo's outer optimizer on averaging's rounds across all workers.

"sgd" with lr 1 and no momentum is the plain mean to the bit (with and without compression); "nesterov" is
the hand computation of the paper's step (the consensus minus lr times the Nesterov update of the averaged
change, batch-norm statistics the plain mean); every rank holds the same bytes after every round; the saved
state (anchor and momentum) continues bit for bit, and loads onto another number of workers. Ranks are threads
of the fake communicator: no processes.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional

from shoal.algorithms import make_algorithm
from shoal.algorithms.averaging import AveragingOptions, ModelAveraging
from shoal.algorithms.base import model_state
from shoal.cluster.fake import run_ranks
from shoal.errors import ConfigError
from shoal.jobs import from_dict
from shoal.train.checkpoint import _differs

FEATURES, CLASSES = 6, 3
NESTEROV = {"name": "nesterov", "lr": 0.7, "momentum": 0.9}
PLAIN = {"name": "sgd", "lr": 1, "momentum": 0}


def make_model() -> nn.Module:
    """The same initial weights on every rank, from a generator of their own (ranks are threads); batch norm's
    running statistics are floating-point buffers that rounds average too."""
    model = nn.Sequential(nn.Linear(FEATURES, 10), nn.BatchNorm1d(10), nn.Tanh(), nn.Linear(10, CLASSES))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)


def local_step(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, step: int, rows: int = 8) -> None:
    generator = torch.Generator().manual_seed(1000 * rank + step)
    features = torch.randn(rows, FEATURES, generator=generator)
    labels = torch.randint(0, CLASSES, (rows,), generator=generator)
    optimizer.zero_grad()
    functional.cross_entropy(model(features), labels).backward()
    optimizer.step()


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([tensor.detach().reshape(-1) for tensor in model_state(model)]).clone()


def train(comm, options: dict, steps: range, *, epoch_steps: int = 6, weigh: bool = False, resume: dict | None = None,
          stop: int | None = None) -> dict:
    """Global steps `steps` (epochs of `epoch_steps`) on this rank, after loading `resume`; this rank's weights after
    every round across all workers, the final ones, and the state to resume from after step `stop`."""
    model = make_model()
    optimizer = make_optimizer(model)
    algorithm = ModelAveraging(AveragingOptions(**options))
    algorithm.weigh_by_rows = weigh
    algorithm.setup(model, optimizer, comm)
    if resume is not None:
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        algorithm.load_state_dict(resume["algorithm"])
        if resume.get("reshard"):
            algorithm.reshard_()
    rounds, saved = [], None
    for step in steps:
        local_step(model, optimizer, comm.rank, step, rows=6 + 2 * comm.rank if weigh else 8)
        algorithm.after_backward(6 + 2 * comm.rank if weigh else 8)
        algorithm.after_step(step)
        if step % epoch_steps == 0:
            algorithm.end_epoch(step // epoch_steps - 1)
        if algorithm.holds_consensus():
            rounds.append(flat(model))
        if step == stop:
            saved = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                   "algorithm": algorithm.state_dict()})
    return {"rounds": rounds, "state": flat(model), "saved": saved}


def on_ranks(size: int, options: dict, steps: range, **keywords) -> list[dict]:
    return run_ranks(size, lambda comm: train(comm, options, steps, **keywords), timeout=20)


def assert_alike(results: list[dict]) -> None:
    """Every rank holds the same bytes after every round."""
    for index, replicas in enumerate(zip(*(result["rounds"] for result in results), strict=True)):
        assert all(torch.equal(replica, replicas[0]) for replica in replicas), f"round {index}: ranks differ"


@pytest.mark.parametrize(("compression", "weigh", "groups"), [
    ("none", False, {}), ("none", True, {}), ("bf16", True, {}), ("powersgd", False, {}),
    ("none", False, {"group_period": 1}),  # one group: its rounds are every worker's, and step too
])
def test_sgd_of_rate_1_without_momentum_is_the_plain_mean_bit_for_bit(compression, weigh, groups):
    options = {"period": 3, "compression": compression, "compression_rank": 2, **groups}
    plain = on_ranks(3, options, range(1, 13), weigh=weigh)
    outer = on_ranks(3, {**options, "outer": PLAIN}, range(1, 13), weigh=weigh)
    assert len(plain[0]["rounds"]) == (12 if groups else 4)
    for mine, theirs in zip(plain, outer, strict=True):
        assert torch.equal(mine["state"], theirs["state"])
        assert all(torch.equal(a, b) for a, b in zip(mine["rounds"], theirs["rounds"], strict=True))
    assert_alike(outer)


def hand_computed(size: int, rounds: int, period: int) -> list[torch.Tensor]:
    """`size` replicas trained alone; every `period` steps the consensus steps by Nesterov's SGD with the mean of
    (consensus - replica) as its gradient, buffers take the plain mean; the consensus after each round."""
    replicas = [make_model() for _ in range(size)]
    optimizers = [make_optimizer(model) for model in replicas]
    parameters = sum(p.numel() for p in replicas[0].parameters())
    consensus, buffer, after = flat(replicas[0]), None, []
    lr, momentum = NESTEROV["lr"], NESTEROV["momentum"]
    for step in range(1, rounds * period + 1):
        for rank, (model, optimizer) in enumerate(zip(replicas, optimizers, strict=True)):
            local_step(model, optimizer, rank, step)
        if step % period:
            continue
        mean = sum(flat(model) for model in replicas) / size
        change = (consensus - mean)[:parameters]
        buffer = change.clone() if buffer is None else momentum * buffer + change
        update = change + momentum * buffer
        consensus = torch.cat([consensus[:parameters] - lr * update, mean[parameters:]])
        after.append(consensus)
        for model in replicas:
            with torch.no_grad():
                offset = 0
                for tensor in model_state(model):
                    tensor.copy_(consensus[offset:offset + tensor.numel()].view_as(tensor))
                    offset += tensor.numel()
    return after


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_nesterov_is_the_hand_computed_step_over_3_rounds(size, compression):
    results = on_ranks(size, {"period": 2, "compression": compression, "outer": NESTEROV}, range(1, 7))
    expected = hand_computed(size, rounds=3, period=2)
    assert_alike(results)
    assert len(results[0]["rounds"]) == 3
    plain = on_ranks(size, {"period": 2}, range(1, 7))
    tolerance = 1e-5 if compression == "none" else 1e-3  # fp16 rounds the changes on the wire
    for index, (got, wanted) in enumerate(zip(results[0]["rounds"], expected, strict=True)):
        assert torch.allclose(got, wanted, rtol=0, atol=tolerance), f"round {index}: {(got - wanted).abs().max()}"
    # the outer step moved the consensus well away from the plain mean: the comparison above means something
    assert (results[0]["state"] - plain[0]["state"]).abs().max() > 10 * tolerance


@pytest.mark.parametrize("compression", ["none", "powersgd"])
def test_replicas_hold_the_same_bytes_after_every_round(compression):
    options = {"period": 2, "compression": compression, "compression_rank": 2, "outer": NESTEROV}
    results = on_ranks(3, options, range(1, 13), weigh=True)
    assert len(results[0]["rounds"]) == 6
    assert_alike(results)


@pytest.mark.parametrize("compression", ["none", "bf16"])
def test_a_saved_state_continues_bit_for_bit(compression):
    options = {"period": 2, "compression": compression, "outer": NESTEROV}
    whole = on_ranks(2, options, range(1, 13), stop=4)  # stops after round 2 for the resume below
    saved = [result["saved"] for result in whole]
    assert set(saved[0]["algorithm"]) >= {"anchor", "outer", "averaged_at"}
    resumed = run_ranks(2, lambda comm: train(comm, options, range(5, 13), resume=saved[comm.rank]), timeout=20)
    for mine, theirs in zip(whole, resumed, strict=True):
        assert torch.equal(mine["state"], theirs["state"])
    # without its momentum the resume would take other steps: the state saved is what makes it exact
    forgetful = [{**state, "algorithm": {key: value for key, value in state["algorithm"].items() if key != "outer"}}
                 for state in saved]
    lost = run_ranks(2, lambda comm: train(comm, options, range(5, 13), resume=forgetful[comm.rank]), timeout=20)
    assert not torch.equal(lost[0]["state"], whole[0]["state"])


def test_rank_0s_state_resumes_on_3_workers():
    options = {"period": 2, "outer": NESTEROV}
    before = on_ranks(2, options, range(1, 7), stop=6)  # an epoch's end: the replicas hold the consensus
    state = {**before[0]["saved"], "reshard": True}
    after = run_ranks(3, lambda comm: train(comm, options, range(7, 13), resume=state), timeout=20)
    assert len(after[0]["rounds"]) == 3
    assert_alike(after)
    assert torch.equal(before[0]["state"], before[1]["state"])
    assert not torch.equal(after[0]["state"], before[0]["state"])  # trained on from there
    # each rank's algorithm took rank 0's anchor and momentum
    moved = run_ranks(3, lambda comm: _loaded(comm, options, state), timeout=20)
    for anchor, momentum in moved:
        assert torch.equal(anchor, state["algorithm"]["anchor"])
        assert torch.equal(momentum, state["algorithm"]["outer"]["momentum"])


def _loaded(comm, options: dict, state: dict) -> tuple[torch.Tensor, torch.Tensor]:
    model = make_model()
    algorithm = ModelAveraging(AveragingOptions(**options))
    algorithm.setup(model, make_optimizer(model), comm)
    model.load_state_dict(state["model"])
    algorithm.load_state_dict(state["algorithm"])
    algorithm.reshard_()
    saved = algorithm.state_dict()
    return saved["anchor"], saved["outer"]["momentum"]


# ---------------------------------------------------------------- the job file


@pytest.mark.parametrize(("outer", "message"), [
    ("nesterov", 'algorithm.outer: must be a table such as { name = "nesterov", lr = 0.7, momentum = 0.9 }, '
                 "got 'nesterov'"),
    ({"lr": 0.7}, 'algorithm.outer.name: required, as in outer = { name = "nesterov", lr = 0.7, momentum = 0.9 }'),
    ({"name": "sgd"}, 'algorithm.outer.lr: required, as in outer = { name = "nesterov", lr = 0.7, momentum = 0.9 }'),
    ({"name": "adam", "lr": 1}, "algorithm.outer.name: must be \"sgd\" or \"nesterov\", got 'adam'"),
    ({"name": "sgd", "lr": 0}, "algorithm.outer.lr: must be a number > 0, got 0"),
    ({"name": "sgd", "lr": True}, "algorithm.outer.lr: must be a number > 0, got True"),
    ({"name": "sgd", "lr": float("nan")}, "algorithm.outer.lr: must be a number > 0, got nan"),
    ({"name": "sgd", "lr": 1, "momentum": 1}, "algorithm.outer.momentum: must be a number from 0 up to (not "
                                              "including) 1, got 1"),
    ({"name": "nesterov", "lr": 0.7}, 'algorithm.outer.momentum: "nesterov" needs a momentum > 0 (DiLoCo\'s is '
                                      "0.9), got 0"),
    ({"name": "sgd", "lr": 1, "beta": 0.5}, "algorithm.outer.beta: unknown key; the outer optimizer takes name, "
                                            "lr, momentum"),
])
def test_bad_outer_options_are_one_line_naming_the_key(outer, message):
    with pytest.raises(ConfigError) as raised:
        make_algorithm("averaging", {"outer": outer})
    assert str(raised.value) == message


def job_options(tmp_path, algorithm: dict) -> dict:
    return from_dict({"model": {"layers": [{"dense": 2}]}, "data": {"train": str(tmp_path)},
                      "algorithm": algorithm}, name="job").algorithm.options


def test_a_job_file_sets_it_for_averaging_and_no_other_algorithm(tmp_path):
    assert "outer" not in job_options(tmp_path, {"name": "averaging"})
    assert job_options(tmp_path, {"name": "averaging", "outer": NESTEROV})["outer"] == NESTEROV
    for name in ("sync", "easgd", "downpour", "none"):
        with pytest.raises(ConfigError) as raised:
            job_options(tmp_path, {"name": name, "outer": NESTEROV})
        assert str(raised.value) == (f"algorithm.outer: an outer optimizer steps on the rounds of 'averaging', not "
                                     f"of '{name}'; remove it, or choose an algorithm that has it")
    with pytest.raises(ConfigError, match=r"^algorithm.outer: expected dict \| None, got 0.7$"):
        job_options(tmp_path, {"name": "averaging", "outer": 0.7})
    with pytest.raises(ConfigError, match=r"^algorithm.outer.lr: must be a number > 0, got 'fast'$"):
        job_options(tmp_path, {"name": "averaging", "outer": {"name": "sgd", "lr": "fast"}})


def test_a_resume_compares_the_outer_optimizer():
    """The algorithm's options are in the checkpoint's fingerprint: a checkpoint without `outer` ran the plain
    mean, so turning it on (or changing it) as a job resumes is refused."""
    before = {"name": "averaging", "period": 2}
    assert not _differs("algorithm", before, {"name": "averaging", "period": 2})
    assert _differs("algorithm", before, {"name": "averaging", "period": 2, "outer": NESTEROV})
    assert _differs("algorithm", {**before, "outer": NESTEROV}, {**before, "outer": {**NESTEROV, "lr": 0.5}})
