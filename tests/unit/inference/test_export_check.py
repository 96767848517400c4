"""shoal.inference.export_check: a model that branches on its input is refused; a traced file that kept one
branch is caught on the sample rows; the sample rows fall on both sides of a threshold."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from shoal.inference.export_check import ExportRefused, check_control_flow, compare, sample_batches, traced


class Branchy(nn.Module):
    """Decides on the values of its input: a trace keeps the branch its example took."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x):
        if x[:, 0].mean() > 0:
            return self.a(x)
        return self.b(x) * 2 + 1


EXAMPLE = torch.zeros(2, 4)
ARTIFACT = {"spec": {"input": [4]}, "feature_dtype": "float32"}


def test_torch_export_refuses_a_branch_on_the_data():
    with pytest.raises(ExportRefused, match=r"branches on its input's values \(.*x\[:, 0\]\.mean\(\) > 0"):
        check_control_flow(Branchy().eval(), EXAMPLE)
    check_control_flow(nn.Sequential(nn.Linear(4, 2)).eval(), EXAMPLE)  # a plain model passes


def test_a_tracer_warning_is_a_refusal():
    with pytest.raises(ExportRefused, match="tracing the model warned: Converting a tensor to a Python boolean"):
        traced(lambda: torch.jit.trace(Branchy().eval(), EXAMPLE, check_trace=False))


def test_the_sample_rows_catch_a_trace_that_kept_one_branch(tmp_path):
    model = Branchy().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept_one = torch.jit.trace(model, EXAMPLE, check_trace=False)  # as export did: warnings hidden
    batches = sample_batches(tmp_path, ARTIFACT)  # no job.toml: drawn rows only
    taken = {bool(rows[:, 0].mean() > 0) for _, rows in batches}
    assert taken == {True, False}  # both branches are exercised

    def run(rows):
        return kept_one(torch.from_numpy(rows)).detach().numpy()

    with pytest.raises(ExportRefused, match=r"largest difference [0-9.]+ on drawn \w+ rows .*rtol 0.0001 "
                                            r"of the row's largest output, atol 1e-05"):
        compare(model, run, batches)
    compare(model, lambda rows: model(torch.from_numpy(rows)).detach().numpy(), batches)  # the same answers pass


def test_uint8_rows_are_drawn_in_their_dtype_both_dark_and_bright(tmp_path):
    batches = dict(sample_batches(tmp_path, {"spec": {"input": [2, 2]}, "feature_dtype": "uint8"}))
    assert all(rows.dtype == np.uint8 and rows.shape[1] == 4 for rows in batches.values())
    assert batches["drawn low"].max() < 128 <= batches["drawn high"].min()
    assert len(batches["drawn one row"]) == 1


def test_torchs_own_warnings_do_not_refuse_a_graph_torch_export_vouched_for():
    from shoal.model import build_model

    lstm = build_model({"input": [5, 3], "layers": [{"lstm": 4}, {"dense": 2}]}).eval()  # its trace warns
    example = torch.zeros(2, 5, 3)
    assert check_control_flow(lstm, example) is True
    with pytest.raises(ExportRefused, match="tracing the model warned"):
        traced(lambda: torch.jit.trace(lstm, example, check_trace=False))
    traced(lambda: torch.jit.trace(lstm, example, check_trace=False), vouched=True)


def test_rounding_at_the_scale_of_the_row_passes_and_a_real_difference_does_not(tmp_path):
    """Two correct float32 computations differ by rounding at the size of a row's sums, so a logit near zero
    beside large ones may move by far more than rtol of itself (an MLP 784-512-512-10 with trained-size weights
    did so in onnx's evaluator on the large drawn rows); a wrong value on that logit is still refused."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3)).eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[30.0, 0, 0, 0], [0, 0, 0, 0], [1.0, 1, 0, 0]]))
        model[0].bias.zero_()
    batches = sample_batches(tmp_path, ARTIFACT)

    def rounded(rows):  # every output moved by 1e-6 of its row's largest: float32 rounding of the row's sums
        outputs = model(torch.from_numpy(rows)).detach().numpy()
        return outputs + 1e-6 * np.abs(outputs).max(axis=1, keepdims=True)

    compare(model, rounded, batches)

    def wrong(rows):  # the middle output, always 0, off by 1e-2 of the row's largest
        outputs = model(torch.from_numpy(rows)).detach().numpy()
        outputs[:, 1] += 1e-2 * np.abs(outputs).max(axis=1)
        return outputs

    with pytest.raises(ExportRefused, match="largest difference"):
        compare(model, wrong, batches)


def test_infinities_the_file_shares_with_the_model_pass(tmp_path):
    class Exponential(nn.Module):
        def forward(self, x):
            return torch.exp(x)  # overflows to inf on the large drawn rows, in the file alike

    model = Exponential()
    compare(model, lambda rows: np.exp(rows), sample_batches(tmp_path, ARTIFACT))


class Embedded(nn.Module):
    """Integer codes stored as int32 features, looked up in a table of 256: a negative code is no input."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.table, self.out = nn.Embedding(256, 3), nn.Linear(3, 2)

    def forward(self, x):
        return self.out(self.table(x.long()).sum(1))


@pytest.mark.parametrize("format", ["torchscript", "onnx"])
def test_drawn_rows_the_model_itself_refuses_are_passed_over(tmp_path, format):
    from shoal.inference.export import CHECKS, WRITERS

    artifact = {"spec": {"input": [4]}, "feature_dtype": "int32"}
    path = tmp_path / f"model.{format}"
    WRITERS[format](Embedded(), artifact, path)
    CHECKS[format](Embedded(), artifact, path, tmp_path)  # the drawn codes below 0 are not compared
    batches = dict(sample_batches(tmp_path, artifact))
    assert batches["drawn random"].min() < 0  # what the model cannot take
    with pytest.raises(IndexError):  # rows from the run's own data are never passed over
        compare(Embedded(), lambda rows: rows, [("data.test", batches["drawn random"])])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_model_shipped_from_a_gpu_is_rebuilt_on_the_cpu(tmp_path):
    from shoal.objects import save_object
    from shoal.run.artifacts import rebuild

    model = nn.Sequential(nn.Linear(4, 2)).cuda()  # as shoal.fit ships a user's module: where it sits
    save_object(model, tmp_path / "model.object.pkl", "model")
    artifact = {"spec": {"input": [4], "object": "model.object.pkl"},
                "state_dict": {key: value.cpu() for key, value in model.state_dict().items()}}
    rebuilt = rebuild(artifact, tmp_path / "model.pt", trust=True)
    assert all(parameter.device.type == "cpu" for parameter in rebuilt.parameters())
