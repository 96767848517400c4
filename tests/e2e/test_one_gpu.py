"""shoal on a machine with one GPU, through the command line: a one-worker job trains on cuda:0 in fp32 and
in bf16 (autocast on CUDA), and its run predicts on a machine without a GPU (the checkpoint holds CUDA
tensors); asked for two workers on one GPU, or two nodes of one job on the machine, `cluster.device =
"cuda"` is refused in one line and "auto" puts both on the CPU (NCCL takes one GPU per rank). Skipped where
CUDA is absent: the CPU paths are tested elsewhere."""

from __future__ import annotations

import socket

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from shoal.events import read_events
from tests.e2e.jobs import write_job, write_task
from tests.e2e.test_train import set_arguments, shoal_command, two_nodes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: this machine has no GPU")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("task"), rows=4000, test_rows=500)


def trained(task, folder, project_env, *settings: str) -> list[dict]:
    """The events of a one-worker job of `task`, run with the `--set` `settings`."""
    job = write_job(folder / "job.toml", *task, algorithm="sync", epochs=3)
    finished = shoal_command("train", job, "--workers", 1, "--run-dir", folder / "run", *set_arguments(settings),
                             env=project_env)
    assert finished.returncode == 0, finished.stderr
    return list(read_events(folder / "run"))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_one_worker_trains_on_the_gpu(task, tmp_path, project_env, precision):
    events = trained(task, tmp_path, project_env, "cluster.device='cuda'", f"train.precision='{precision}'")
    start, end = events[0], events[-1]
    assert start["device"] == "cuda:0"
    losses = [event["train_loss"] for event in events if event["event"] == "epoch_end"]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    assert end["test"]["accuracy"] > 0.85, end  # the task is learnable, in bf16 too


def test_a_run_trained_on_the_gpu_predicts_without_one(task, tmp_path, project_env):
    trained(task, tmp_path, project_env, "cluster.device='cuda'")
    without_gpu = {**project_env, "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "predictions.parquet"
    finished = shoal_command("predict", tmp_path / "run", task[1], "--out", out, env=without_gpu)
    assert finished.returncode == 0, finished.stderr
    table = pq.read_table(out).to_pydict()
    end = list(read_events(tmp_path / "run"))[-1]
    accuracy = np.mean(np.array(table["prediction"]) == np.array(table["label"]))
    assert accuracy == pytest.approx(end["test"]["accuracy"], abs=0.01)  # the GPU's arithmetic, to rounding


def test_two_workers_on_one_gpu(task, tmp_path, project_env):
    if torch.cuda.device_count() != 1:
        pytest.skip(f"needs exactly one GPU, this machine has {torch.cuda.device_count()}")
    job = write_job(tmp_path / "job.toml", *task, algorithm="sync", epochs=1)
    refused = shoal_command("train", job, "--workers", 2, "--run-dir", tmp_path / "refused", "--set",
                            "cluster.device='cuda'", env=project_env)
    assert refused.returncode == 2
    last = refused.stderr.strip().splitlines()[-1]
    assert last.endswith("cluster.device: 'cuda' with 2 workers on a machine with 1 GPU(s): use at most one "
                         "worker per GPU"), refused.stderr
    shared = shoal_command("train", job, "--workers", 2, "--run-dir", tmp_path / "auto", env=project_env)
    assert shared.returncode == 0, shared.stderr
    assert next(read_events(tmp_path / "auto"))["device"] == "cpu"


def test_two_nodes_on_one_gpu(task, tmp_path, project_env):
    """Each node sees the machine's GPU as its own: "auto" agrees on the CPU, "cuda" is refused in one line."""
    if torch.cuda.device_count() != 1:
        pytest.skip(f"needs exactly one GPU, this machine has {torch.cuda.device_count()}")
    job = write_job(tmp_path / "job.toml", *task, algorithm="sync", epochs=1)
    shared = two_nodes(job, tmp_path / "auto", project_env)
    assert [node.returncode for node in shared] == [0, 0], [node.stderr[-2000:] for node in shared]
    assert next(read_events(tmp_path / "auto" / "node0"))["device"] == "cpu"
    assert f"the job trains on the CPU: ranks 0 and 1 on {socket.gethostname()} share one GPU" in shared[0].stderr
    refused = two_nodes(job, tmp_path / "cuda", project_env, "cluster.device='cuda'")
    assert [node.returncode for node in refused] == [2, 2], [node.stderr[-2000:] for node in refused]
    assert refused[0].stderr.strip().splitlines()[-1].endswith(
        f"cluster.device: 'cuda' but ranks 0 and 1 on {socket.gethostname()} share one GPU (NCCL takes one GPU per "
        "rank): run one node per machine, show each node its own GPUs (CUDA_VISIBLE_DEVICES), or set "
        "cluster.device = 'cpu'"), refused[0].stderr[-2000:]
