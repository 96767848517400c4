"""Models from layer lists and factories: output shapes on real forward passes, and errors that name the layer."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

from shoal import model as model_module
from shoal.errors import ConfigError
from shoal.model import ACTIVATIONS, build_model, from_factory, from_layers, output_shape


def run(model: nn.Module, input_shape: list[int], batch: int = 5) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(torch.randn(batch, *input_shape))


def layer_error(input_shape, layers) -> str:
    with pytest.raises(ConfigError) as caught:
        from_layers(input_shape, layers)
    message = str(caught.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- each layer kind


def test_dense_without_activation_is_one_linear():
    torch.manual_seed(0)
    model = from_layers([7], [{"dense": 4}])
    assert [type(m) for m in model] == [nn.Linear]
    inputs = torch.randn(3, 7)
    linear = model[0]
    assert linear.in_features == 7 and linear.out_features == 4
    torch.testing.assert_close(model(inputs), inputs @ linear.weight.T + linear.bias)


def test_dense_with_activation():
    model = from_layers([7], [{"dense": 4, "activation": "relu"}])
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU]
    inputs = torch.randn(6, 7)
    outputs = model(inputs)
    assert outputs.shape == (6, 4)
    torch.testing.assert_close(outputs, torch.relu(model[0](inputs)))
    assert (outputs >= 0).all()


def test_dense_without_bias():
    model = from_layers([7], [{"dense": 4, "bias": False}])
    assert model[0].bias is None
    assert sum(p.numel() for p in model.parameters()) == 28


def test_dense_flattens_a_multidimensional_sample():
    model = from_layers([2, 3, 4], [{"dense": 5}])
    assert run(model, [2, 3, 4]).shape == (5, 5)
    assert model[-1].in_features == 24


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_alone(name):
    model = from_layers([6], [{"activation": name}])
    inputs = torch.randn(4, 6)
    expected = {
        "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "gelu": nn.functional.gelu,
        "elu": nn.functional.elu, "silu": nn.functional.silu, "leaky_relu": nn.functional.leaky_relu,
        "softmax": lambda x: torch.softmax(x, dim=-1), "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
        "linear": lambda x: x,
    }[name]
    torch.testing.assert_close(model(inputs), expected(inputs))


def test_dropout_keeps_the_shape_and_drops_in_training():
    model = from_layers([1000], [{"dropout": 0.5}])
    assert isinstance(model[0], nn.Dropout) and model[0].p == 0.5
    inputs = torch.ones(4, 1000)
    model.eval()
    torch.testing.assert_close(model(inputs), inputs)
    model.train()
    torch.manual_seed(0)
    outputs = model(inputs)
    assert outputs.shape == (4, 1000)
    assert set(outputs.unique().tolist()) == {0.0, 2.0}  # kept values scaled by 1 / (1 - p)


def test_dropout_zero_is_allowed():
    model = from_layers([3], [{"dropout": 0}])
    assert model[0].p == 0


def test_conv2d_on_a_grey_image_adds_a_channel():
    model = from_layers([28, 28], [{"conv2d": 8, "kernel": 5}])
    assert run(model, [28, 28]).shape == (5, 8, 24, 24)
    conv = [m for m in model if isinstance(m, nn.Conv2d)][0]
    assert conv.in_channels == 1


def test_conv2d_on_channels_height_width():
    model = from_layers([3, 16, 12], [{"conv2d": 4, "kernel": 3, "stride": 2, "padding": 1, "activation": "relu"}])
    outputs = run(model, [3, 16, 12])
    # (16 + 2 - 3) // 2 + 1 = 8, (12 + 2 - 3) // 2 + 1 = 6
    assert outputs.shape == (5, 4, 8, 6)
    assert (outputs >= 0).all()
    assert model[0].in_channels == 3


def test_conv2d_on_flat_input_is_refused():
    message = layer_error([10], [{"conv2d": 4}])
    assert "model.layers[0]" in message and "conv2d" in message


def test_maxpool():
    model = from_layers([3, 8, 10], [{"maxpool": 2}])
    inputs = torch.randn(2, 3, 8, 10)
    outputs = model(inputs)
    assert outputs.shape == (2, 3, 4, 5)
    torch.testing.assert_close(outputs, inputs.reshape(2, 3, 4, 2, 5, 2).amax(dim=(3, 5)))


def test_maxpool_with_stride():
    model = from_layers([1, 9, 9], [{"maxpool": 3, "stride": 1}])
    assert run(model, [1, 9, 9]).shape == (5, 1, 7, 7)


def test_flatten():
    model = from_layers([2, 3, 4], [{"flatten": True}])
    inputs = torch.randn(5, 2, 3, 4)
    torch.testing.assert_close(model(inputs), inputs.reshape(5, 24))


def test_batchnorm_on_features():
    model = from_layers([6], [{"batchnorm": True}])
    assert isinstance(model[0], nn.BatchNorm1d) and model[0].num_features == 6
    model.train()
    inputs = torch.randn(32, 6) * 3 + 2
    outputs = model(inputs)
    assert outputs.shape == (32, 6)
    torch.testing.assert_close(outputs.mean(dim=0), torch.zeros(6), atol=1e-5, rtol=0)


def test_batchnorm_on_channels_and_length():
    model = from_layers([4, 9], [{"batchnorm": True}])
    assert isinstance(model[0], nn.BatchNorm1d) and model[0].num_features == 4
    assert run(model, [4, 9]).shape == (5, 4, 9)


def test_batchnorm_on_images():
    model = from_layers([3, 5, 5], [{"batchnorm": True}])
    assert isinstance(model[0], nn.BatchNorm2d) and model[0].num_features == 3
    model.train()
    outputs = model(torch.randn(8, 3, 5, 5) + 4)
    assert outputs.shape == (8, 3, 5, 5)
    torch.testing.assert_close(outputs.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5, rtol=0)


def test_lstm_returns_the_last_output():
    torch.manual_seed(0)
    model = from_layers([7, 3], [{"lstm": 5, "layers": 2}])
    inputs = torch.randn(4, 7, 3)
    outputs = model(inputs)
    assert outputs.shape == (4, 5)
    lstm = model[0].lstm
    assert lstm.num_layers == 2 and lstm.input_size == 3 and lstm.hidden_size == 5
    everything, _ = lstm(inputs)
    torch.testing.assert_close(outputs, everything[:, -1])


def test_reshape():
    model = from_layers([12], [{"reshape": [3, 4]}])
    inputs = torch.arange(24.0).reshape(2, 12)
    torch.testing.assert_close(model(inputs), inputs.reshape(2, 3, 4))


def test_a_small_convolutional_network():
    layers = [
        {"conv2d": 4, "kernel": 3, "activation": "relu"},
        {"maxpool": 2},
        {"batchnorm": True},
        {"flatten": True},
        {"dense": 10},
    ]
    model = from_layers([28, 28], layers)
    assert run(model, [28, 28]).shape == (5, 10)
    assert output_shape(model, [28, 28]) == (10,)
    assert model[-1].in_features == 4 * 13 * 13


def test_paper_model_parameter_count():
    model = from_layers([123], [{"dense": 100, "activation": "relu"}, {"dropout": 0.5}, {"dense": 2}])
    assert sum(p.numel() for p in model.parameters()) == 123 * 100 + 100 + 100 * 2 + 2
    assert run(model, [123]).shape == (5, 2)


# ---------------------------------------------------------------- errors name the layer


def test_unknown_layer_kind():
    message = layer_error([4], [{"dense": 3}, {"dens": 2}])
    assert message.startswith("model.layers[1]:")
    assert "dens" in message and "dense" in message  # the bad key and the known kinds


def test_two_kinds_in_one_layer():
    message = layer_error([4], [{"dense": 3, "dropout": 0.1}])
    assert message.startswith("model.layers[0]:") and "exactly one kind" in message


def test_unknown_option_with_suggestion():
    message = layer_error([4], [{"dropout": 0.1}, {"dense": 3, "activaton": "relu"}])
    assert message == "model.layers[1]: unknown option 'activaton' (did you mean 'activation'?)"


def test_option_of_another_kind_is_unknown():
    message = layer_error([4], [{"dropout": 0.1, "kernel": 3}])
    assert message.startswith("model.layers[0]: unknown option 'kernel'")


@pytest.mark.parametrize("rate", [1.5, 1, -0.1, "half", True])
def test_bad_dropout(rate):
    message = layer_error([4], [{"dense": 3}, {"dropout": rate}])
    assert message.startswith("model.layers[1].dropout:") and repr(rate) in message


@pytest.mark.parametrize("width", [0, -3, 2.5, "ten", True])
def test_bad_dense_width(width):
    message = layer_error([4], [{"dense": width}])
    assert message == f"model.layers[0].dense: must be a positive integer, got {width!r}"


def test_reshape_of_the_wrong_size():
    message = layer_error([12], [{"dense": 10}, {"reshape": [3, 5]}])
    assert message.startswith("model.layers[1].reshape:") and "10" in message


def test_lstm_on_flat_input():
    message = layer_error([12], [{"lstm": 4}])
    assert message.startswith("model.layers[0]:") and "lstm" in message and "[12]" in message


def test_unknown_activation():
    message = layer_error([4], [{"dense": 3, "activation": "swish"}])
    assert message.startswith("model.layers[0].activation:") and "'swish'" in message
    assert all(name in message for name in ACTIVATIONS)
    message = layer_error([4], [{"activation": "swish"}])
    assert message.startswith("model.layers[0].activation:")


def test_layer_that_does_not_fit_its_input():
    message = layer_error([1, 4, 4], [{"conv2d": 2, "kernel": 7}])
    assert message.startswith("model.layers[0]: does not fit input shape [1, 4, 4]")


def test_layer_that_is_not_a_table():
    assert layer_error([4], [{"dense": 2}, "relu"]).startswith("model.layers[1]: must be a table")


def test_empty_layer_list():
    assert layer_error([4], []) == "model.layers: empty"


def test_bad_conv2d_kernel_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model\.layers\[0\]"):
        from_layers([1, 8, 8], [{"conv2d": 3, "kernel": "x"}])


def test_bad_lstm_layers_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model\.layers\[0\]"):
        from_layers([5, 3], [{"lstm": 3, "layers": 0}])


def test_reshape_with_non_integers_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model\.layers\[0\]"):
        from_layers([4], [{"reshape": [2.0, 2.0]}])


# ---------------------------------------------------------------- factories


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    """A module `shoal_test_factories` on sys.path with a good and a bad factory."""
    (tmp_path / "shoal_test_factories.py").write_text(textwrap.dedent("""
        from torch import nn

        def mlp(features, hidden=8, classes=2):
            return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

        def not_a_module():
            return "a string"
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "shoal_test_factories", raising=False)
    return "shoal_test_factories"


def test_from_factory(factory_module):
    model = from_factory(f"{factory_module}:mlp", {"features": 5, "hidden": 3})
    assert isinstance(model, nn.Sequential)
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear]
    assert run(model, [5]).shape == (5, 2)
    assert sum(p.numel() for p in model.parameters()) == 5 * 3 + 3 + 3 * 2 + 2


def test_build_model_with_a_factory(factory_module):
    model = build_model({"factory": f"{factory_module}:mlp", "arguments": {"features": 4, "classes": 3}})
    assert run(model, [4]).shape == (5, 3)


def test_factory_module_not_importable():
    with pytest.raises(ConfigError) as caught:
        from_factory("shoal_no_such_module_anywhere:build", {})
    assert str(caught.value).startswith("model.factory: cannot import 'shoal_no_such_module_anywhere:build'")


def test_factory_function_missing(factory_module):
    with pytest.raises(ConfigError, match=r"^model\.factory: cannot import 'shoal_test_factories:absent'"):
        from_factory(f"{factory_module}:absent", {})


def test_factory_returning_a_non_module(factory_module):
    with pytest.raises(ConfigError) as caught:
        from_factory(f"{factory_module}:not_a_module", {})
    assert str(caught.value) == ("model.factory: 'shoal_test_factories:not_a_module' returned str, "
                                 "not a torch.nn.Module")


def test_factory_with_a_wrong_argument_is_a_config_error(factory_module):
    with pytest.raises(ConfigError, match="model.arguments"):
        from_factory(f"{factory_module}:mlp", {"features": 4, "bogus": 1})


# ---------------------------------------------------------------- build_model


def test_build_model_is_deterministic_under_a_seed():
    spec = {"input": [1, 12, 12], "layers": [{"conv2d": 3, "activation": "tanh"}, {"flatten": True},
                                             {"dense": 16, "activation": "relu"}, {"dense": 4}]}
    torch.manual_seed(123)
    first = build_model(spec)
    torch.manual_seed(123)
    second = build_model(spec)
    torch.manual_seed(124)
    third = build_model(spec)
    first_state, second_state, third_state = first.state_dict(), second.state_dict(), third.state_dict()
    assert first_state.keys() == second_state.keys()
    for key in first_state:
        torch.testing.assert_close(first_state[key], second_state[key], rtol=0, atol=0)
    assert any(not torch.equal(first_state[key], third_state[key]) for key in first_state)
    inputs = torch.randn(3, 1, 12, 12)
    torch.testing.assert_close(first(inputs), second(inputs), rtol=0, atol=0)


# ---------------------------------------------------------------- shapes told without a forward pass
KNOWN_SHAPES = {
    "dense layers and what keeps a shape": ([12], [{"dense": 8, "activation": name} for name in ACTIVATIONS]
                                           + [{"dropout": 0.5}, {"batchnorm": True}, {"dense": 3, "bias": False}]),
    "a dense layer on an image": ([2, 5, 5], [{"batchnorm": True}, {"dense": 4}]),
    "a dense layer after a convolution": ([1, 8, 8], [{"conv2d": 2, "kernel": 3}, {"flatten": True}, {"dense": 4}]),
}


@pytest.mark.parametrize("case", list(KNOWN_SHAPES))
def test_a_shape_told_without_a_forward_pass_is_the_forward_passs(case, monkeypatch):
    input_shape, layers = KNOWN_SHAPES[case]
    probed = []
    monkeypatch.setattr(model_module, "_known_shape", lambda modules, shape: probed.append(shape))
    forward = from_layers(input_shape, layers)  # every shape from a forward pass
    assert len(probed) >= len(layers)
    monkeypatch.undo()
    told = from_layers(input_shape, layers)
    assert str(told) == str(forward) and run(told, input_shape).shape == run(forward, input_shape).shape


def test_a_forward_returning_more_than_one_tensor_is_one_line_naming_the_model():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, x):
            return self.linear(x), x  # the loss, evaluation and export take one tensor

    with pytest.raises(ConfigError, match=r"^model: its forward returns tuple, not one tensor"):
        output_shape(Pair(), [3])
