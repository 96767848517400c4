"""The per-batch transform: draws repeated for the same step, different across steps, and invisible outside."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from shoal.errors import ConfigError, ShoalError
from shoal.train.transform import Transform, step_seeds


def noisy(batch):
    """An augmentation drawing from all three global generators (and a held-back normal from two)."""
    inputs, labels = batch
    shift = float(np.random.rand()) + random.random() + float(np.random.normal()) + random.gauss(0.0, 1.0)
    return inputs + torch.rand_like(inputs) + shift, labels


def a_batch(rows: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(rows, 3), torch.arange(rows)


def global_states():
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def same_states(first, second) -> bool:
    numpy_first, numpy_second = first[1], second[1]
    return (torch.equal(first[0], second[0]) and np.array_equal(numpy_first[1], numpy_second[1])
            and numpy_first[2:] == numpy_second[2:] and first[2] == second[2])


def test_the_same_step_draws_the_same_whatever_came_before():
    first = Transform(noisy, seed=3, trainer=1)(a_batch(), 2, 5)[0]
    torch.rand(100), np.random.rand(7), random.random()  # a resumed job's generators are elsewhere
    again = Transform(noisy, seed=3, trainer=1)(a_batch(), 2, 5)[0]
    assert torch.equal(first, again)


@pytest.mark.parametrize("other", [(3, 1, 3, 5), (3, 1, 2, 6), (3, 0, 2, 5), (4, 1, 2, 5)])
def test_another_epoch_step_trainer_or_seed_draws_otherwise(other):
    seed, trainer, epoch, step = other
    base = Transform(noisy, seed=3, trainer=1)(a_batch(), 2, 5)[0]
    changed = Transform(noisy, seed=seed, trainer=trainer)(a_batch(), epoch, step)[0]
    assert not torch.equal(base, changed)


def test_each_library_gets_its_own_seed():
    torch_seed, numpy_seed, python_seed = step_seeds(2**63 - 1, 7, 100, 10_000)
    assert 0 <= torch_seed < 2**63 and 0 <= python_seed < 2**63 and 0 <= numpy_seed < 2**32
    assert len({torch_seed, numpy_seed, python_seed}) == 3
    seeds = {step_seeds(0, 0, 0, step)[0] for step in range(1000)}
    assert len(seeds) == 1000


@pytest.mark.parametrize("held_normals", [False, True])
def test_the_global_generators_are_as_they_were(held_normals):
    """torch's, NumPy's and Python's generators after a call are exactly as before, a normal that NumPy or
    Python held back for its next call included: the model's own draws (dropout) are those without it."""
    torch.manual_seed(11), np.random.seed(11), random.seed(11)
    if held_normals:
        np.random.normal(), random.gauss(0.0, 1.0)  # each now holds the second normal of a pair
    transform = Transform(noisy, seed=5, trainer=0)
    before = global_states()
    for step in range(3):
        transform(a_batch(), 0, step)
    assert same_states(before, global_states())
    with_transform = (torch.rand(8), np.random.normal(size=3), random.gauss(0.0, 1.0))

    torch.manual_seed(11), np.random.seed(11), random.seed(11)
    if held_normals:
        np.random.normal(), random.gauss(0.0, 1.0)
    without = (torch.rand(8), np.random.normal(size=3), random.gauss(0.0, 1.0))
    assert torch.equal(with_transform[0], without[0])
    assert np.array_equal(with_transform[1], without[1]) and with_transform[2] == without[2]


def test_a_dropout_model_draws_as_without_a_transform():
    model = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Dropout(0.5))
    transform = Transform(noisy, seed=1, trainer=0)
    outputs = []
    for use in (True, False):
        torch.manual_seed(0)
        steps = []
        for step in range(3):
            batch = transform(a_batch(), 0, step) if use else a_batch()
            steps.append(model(torch.ones_like(batch[0])))
        outputs.append(torch.stack(steps))
    assert torch.equal(outputs[0], outputs[1])


def test_a_dict_batch_keeps_its_keys_and_rows():
    batch = {"image": torch.zeros(5, 2), "label": torch.arange(5)}
    result = Transform(lambda b: {**b, "image": b["image"] + torch.rand(5, 2)}, 0, 0)(batch, 0, 0)
    assert set(result) == {"image", "label"} and result["image"].shape == (5, 2)


def test_a_list_of_two_tensors_comes_back_as_a_tuple():
    result = Transform(lambda b: [b[0] * 2, b[1]], 0, 0)(a_batch(), 0, 0)
    assert isinstance(result, tuple) and len(result) == 2


@pytest.mark.parametrize("function, said", [
    (lambda b: (b[0], b[1], b[1]), "returned a tuple of 3 items; expected (inputs, labels)"),
    (lambda b: b[0], "returned a tensor of shape [4, 3]; expected (inputs, labels)"),
    (lambda b: None, "returned None; expected (inputs, labels)"),
    (lambda b: (b[0][:3], b[1]), "returned a tensor of shape [3, 3] as its inputs; expected a tensor of the "
                                 "batch's 4 rows"),
    (lambda b: (b[0], b[1].tolist()), "returned a list of 4 items as its labels"),
    (lambda b: (b[0], torch.tensor(1)), "returned a tensor of shape [] as its labels"),
])
def test_a_result_of_another_structure_is_one_line_naming_the_key(function, said):
    with pytest.raises(ConfigError) as caught:
        Transform(function, 0, 0)(a_batch(), 0, 0)
    message = str(caught.value)
    assert message.startswith("data.transform: ") and said in message and "\n" not in message


@pytest.mark.parametrize("function, said", [
    (lambda b: {"image": b["image"]}, "returned a dict with keys ['image']; expected a dict with the batch's "
                                      "keys ['image', 'label']"),
    (lambda b: (b["image"], b["label"]), "returned a tuple of 2 items; expected a dict"),
    (lambda b: {**b, "label": b["label"][:2]}, "returned a tensor of shape [2] under 'label'; expected a tensor "
                                               "of the batch's 5 rows"),
])
def test_a_dict_result_of_another_structure_is_one_line(function, said):
    batch = {"image": torch.zeros(5, 2), "label": torch.arange(5)}
    with pytest.raises(ConfigError, match="^data.transform: ") as caught:
        Transform(function, 0, 0)(batch, 0, 0)
    assert said in str(caught.value)


def test_an_exception_in_the_function_is_one_line_and_restores_the_generators():
    def broken(batch):
        torch.rand(3), np.random.rand(), random.random()
        raise ValueError("cannot flip this\nsecond line")

    before = global_states()
    with pytest.raises(ShoalError) as caught:
        Transform(broken, 0, 0)(a_batch(), 0, 0)
    assert str(caught.value) == "data.transform: ValueError: cannot flip this"
    assert isinstance(caught.value.__cause__, ValueError)  # the user's traceback stays reachable
    assert same_states(before, global_states())


def test_an_exception_without_a_message_names_its_type():
    def broken(batch):
        raise KeyError

    with pytest.raises(ShoalError, match=r"^data.transform: KeyError: KeyError$"):
        Transform(broken, 0, 0)(a_batch(), 0, 0)


def test_something_not_callable_is_refused():
    with pytest.raises(ConfigError, match="^data.transform: expected a function taking a batch, got str$"):
        Transform("flip", 0, 0)



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_batch_on_cuda_seeds_and_restores_that_device_generator():
    def on_device(batch):
        return batch[0] + torch.rand_like(batch[0]), batch[1]

    batch = (torch.zeros(4, 3, device="cuda"), torch.arange(4, device="cuda"))
    torch.cuda.manual_seed(9)
    before = torch.cuda.get_rng_state()
    first = Transform(on_device, 2, 0)(batch, 0, 0)[0]
    assert torch.equal(torch.cuda.get_rng_state(), before)
    torch.rand(5, device="cuda")
    assert torch.equal(Transform(on_device, 2, 0)(batch, 0, 0)[0], first)
    assert not torch.equal(Transform(on_device, 2, 0)(batch, 0, 1)[0], first)
