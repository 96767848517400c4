"""A loaded rank file checked before anything of it is applied: weights, optimizer state, random generators."""

from __future__ import annotations

import inspect
import io
import random
import warnings

import numpy as np
import pytest
import torch

from shoal.algorithms import make_algorithm
from shoal.cluster.collectives import Communicator
from shoal.train.checkpoint import Checkpointer, agree_on_latest, load_rank
from shoal.train.prepare import UNUSABLE_OPTIMIZERS, make_optimizer
from shoal.train.state import TrainingState
from shoal.train.state_checks import random_misfit, tensors_misfit
from tests.unit.train.test_checkpoint import rewrite

CPU = torch.device("cpu")
OPTIMIZERS = sorted(cls.__name__.lower() for cls in vars(torch.optim).values()
                    if inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)
                    and cls is not torch.optim.Optimizer and cls.__name__.lower() not in UNUSABLE_OPTIMIZERS)


class Counter:
    global_step = 0


class Masked(torch.nn.Module):
    """A linear layer beside a buffer that is infinite by design (an attention mask's -inf)."""

    def __init__(self, bias: bool = True):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3, bias=bias)
        self.register_buffer("mask", torch.tensor([0.0, float("-inf")]))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.linear(inputs)


def trained(name: str = "adam", allow_nonfinite: bool = False) -> TrainingState:
    """A rank's state after one optimizer step of `name` (Muon takes matrices only: no bias)."""
    torch.manual_seed(0)
    model = Masked(bias=name != "muon")
    optimizer = make_optimizer({"name": name}, model)
    generator = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(8, 4, generator=generator), torch.randint(0, 3, (8,), generator=generator)
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    optimizer.step()
    return TrainingState(model, optimizer, make_algorithm("sync", {}), Counter(), CPU,
                         allow_nonfinite=allow_nonfinite)


def through_a_file(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.fixture(scope="module")
def adam() -> TrainingState:
    return trained("adam")


@pytest.fixture
def written(adam) -> dict:
    """A fresh copy of what an Adam rank writes, as it loads back."""
    return through_a_file(adam.state_dict())


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_state_every_usable_optimizer_writes_fits_a_job_like_it(name):
    state = trained(name)
    assert state.fits(through_a_file(state.state_dict())) == ""


@pytest.mark.parametrize(("damage", "expected"), [
    (lambda s: s["model"].update(**{"linear.weight": torch.zeros(3, 4, dtype=torch.float64)}),
     "its weights do not fit the model ('linear.weight': torch.float64 in the file, torch.float32 in the model)"),
    (lambda s: s["model"]["linear.bias"].__setitem__(1, float("nan")),
     "weight 'linear.bias' holds 1 non-finite value (of 3)"),
    (lambda s: s["optimizer"]["state"][0].update(exp_avg=torch.zeros(3, 5)),
     "the optimizer's 'exp_avg' of 'linear.weight': [3, 5] in the file, the parameter is [3, 4]"),
    (lambda s: s["optimizer"]["state"][1].update(exp_avg_sq=torch.zeros(3, dtype=torch.float16)),
     "the optimizer's 'exp_avg_sq' of 'linear.bias': torch.float16 in the file, the parameter is torch.float32"),
    (lambda s: s["optimizer"]["state"][0]["exp_avg"].fill_(float("inf")),
     "the optimizer's 'exp_avg' of 'linear.weight' holds 12 non-finite values (of 12)"),
    (lambda s: s["optimizer"]["state"].update({7: {"step": torch.tensor(1.0)}}),
     "its optimizer holds state of no parameter of the optimizer (7)"),
    (lambda s: s["optimizer"]["param_groups"][0]["params"].append(2),
     "its optimizer's parameter groups do not fit the optimizer ([3] parameters in the file, [2])"),
    (lambda s: s["optimizer"]["param_groups"][0].update(lr=float("nan")),
     "its optimizer's 'lr' of parameter group 0 is not finite (nan)"),
    (lambda s: s.pop("random"), "its 'random' is missing"),
    (lambda s: s.update(global_step=-3), "its global step is -3"),
    (lambda s: s.update(optimizer=[]), "no optimizer state in it"),
], ids=["weight-dtype", "nan-weight", "moment-shape", "moment-dtype", "inf-moment", "stray-state", "groups",
        "nan-lr", "no-random", "step", "no-optimizer"])
def test_a_rank_file_that_cannot_be_applied_says_why(adam, written, damage, expected):
    damage(written)
    assert adam.fits(written) == expected


def test_non_finite_weights_and_moments_may_be_applied_when_allowed(written):
    written["model"]["linear.weight"][0, 0] = float("nan")
    written["optimizer"]["state"][0]["exp_avg"].fill_(float("inf"))
    assert trained("adam", allow_nonfinite=True).fits(written) == ""
    written["optimizer"]["state"][0]["exp_avg"] = torch.zeros(3, 5)  # a wrong shape is never allowed
    assert "[3, 5] in the file" in trained("adam", allow_nonfinite=True).fits(written)


def test_an_infinite_buffer_is_no_damage(adam, written):
    assert torch.isinf(written["model"]["mask"]).any() and adam.fits(written) == ""


def test_a_factored_moment_fits_its_parameter():
    state = trained("adafactor")
    moments = state.optimizer.state_dict()["state"][0]
    assert moments["row_var"].shape == (3, 1) and moments["col_var"].shape == (1, 4)  # what the rule allows for


def valid_random() -> dict:
    return through_a_file({"random": {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": "MT19937", "keys": torch.from_numpy(np.random.get_state()[1].astype(np.int64)),
                  "position": 624, "has_gauss": 0, "cached": 0.0},
        "python": {"version": 3, "internal": list(random.getstate()[1]), "gauss": None}}})["random"]


@pytest.mark.parametrize(("damage", "expected"), [
    (lambda r: r.update(torch=r["torch"][:-1]),
     "torch's CPU generator state is torch.uint8 [5055], not a torch.ByteTensor of 5056 bytes"),
    (lambda r: r.update(torch=r["torch"].float()), "torch's CPU generator state is torch.float32 [5056]"),
    (lambda r: r["numpy"]["keys"].__setitem__(5, 2**32), "NumPy's generator state holds keys that are not 32-bit"),
    (lambda r: r["numpy"].update(position=700), "NumPy's generator state is not a legacy MT19937 state"),
    (lambda r: r["numpy"].update(keys=r["numpy"]["keys"][:-1]), "NumPy's generator state is not a legacy MT19937"),
    (lambda r: r["numpy"].update(kind="PCG64"), "NumPy's generator state is not a legacy MT19937 state"),
    (lambda r: r["python"]["internal"].pop(), "Python's generator state is not 624 32-bit words"),
    (lambda r: r["python"]["internal"].__setitem__(3, 2**33), "Python's generator state is not 624 32-bit words"),
    (lambda r: r["python"].update(gauss="x"), "Python's generator state is not 624 32-bit words"),
    (lambda r: r.pop("torch"), "no random-generator states in it"),
], ids=["torch-size", "torch-dtype", "numpy-key", "numpy-position", "numpy-keys", "numpy-kind", "python-length",
        "python-word", "python-gauss", "no-torch"])
def test_a_random_generator_record_that_cannot_be_restored_says_why(damage, expected):
    record = valid_random()
    assert random_misfit(record, CPU) == ""
    damage(record)
    assert expected in random_misfit(record, CPU)


def test_the_algorithms_tensors_match_what_it_holds_now_and_are_finite():
    now = {"centre": torch.zeros(5), "compression": {"errors": {}}}
    assert tensors_misfit("state", now, {"centre": torch.ones(5), "pulled_at": 3}, True) == ""
    assert tensors_misfit("state", now, {"centre": torch.ones(6)}, True) == \
        "state['centre']: [6] torch.float32 in the file, [5] torch.float32 now"
    errors = {"compression": {"errors": {"w": torch.tensor([1.0, float("nan")])}}}
    assert tensors_misfit("state", now, errors, True) == "state['compression']['errors']['w'] holds 1 non-finite " \
                                                          "value (of 2)"
    assert tensors_misfit("state", now, errors, False) == ""


def test_a_checkpoint_whose_optimizer_state_does_not_fit_is_passed_over_before_any_of_it_is_applied(tmp_path, adam):
    checkpointer = Checkpointer(tmp_path, Communicator(0, 1), keep=5)
    for epoch in (1, 2):
        adam.counter.global_step = epoch
        checkpointer.save(epoch, adam.state_dict(), {})
    newest = tmp_path / "checkpoints" / "epoch-00002"
    state = load_rank(newest, 0)
    state["optimizer"]["state"][0]["exp_avg"] = torch.zeros(3, 5)  # written so: its digest matches
    rewrite(newest, "rank-00000.pt", state)
    resumed = trained("adam")
    before = {name: value.clone() for name, value in resumed.model.state_dict().items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = agree_on_latest(tmp_path, Communicator(0, 1), coordinator=True, fits=resumed.fits)
    assert found.epoch == 1
    assert [str(warning.message) for warning in caught] == [
        "skipping damaged checkpoint checkpoints/epoch-00002/rank-00000.pt: the optimizer's 'exp_avg' of "
        "'linear.weight': [3, 5] in the file, the parameter is [3, 4]"]
    assert all(torch.equal(value, before[name]) for name, value in resumed.model.state_dict().items())
    with pytest.raises(RuntimeError, match=r"epoch-00002/rank-00000\.pt: the optimizer's 'exp_avg'"):
        load_rank(newest, 0, resumed.fits)  # nor when it is asked for by name
    resumed.load_state_dict(load_rank(found.path, 0, resumed.fits))
    assert resumed.counter.global_step == 1
