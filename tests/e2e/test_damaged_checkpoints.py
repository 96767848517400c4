"""Checkpoints verified before use, through the command line: a flipped bit, a restart that fails at once, NaN weights.

A run of 2 workers and 3 epochs keeps a checkpoint of each epoch. A bit flipped in a tensor of the
newest one (a weight, an optimizer moment, the random generator's state) is found by its digest: the
resume goes on from the epoch before, says which file it passed over, and ends with the weights of
the uninterrupted run. A restart that fails before its first step from a checkpoint restarts from the
epoch before, not from the same one again. Weights that are not finite stop the job before model.pt
is written, in one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.e2e.jobs import write_job, write_task
from tests.e2e.test_recovery import assert_same_weights, events, shoal, weights

EPOCHS = 3


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("task"), rows=600, test_rows=100)


def job_file(path: Path, task, *, at: int = 0, folder: Path | None = None) -> Path:
    """3 epochs, a checkpoint of each kept; with `at`, rank 1 is killed at that training step, then again at the
    first step of its restart (tests.support.models:failing_again_at_once)."""
    model = ('factory = "tests.support.models:failing_again_at_once"\n'
             f'arguments = {{ at = {at}, folder = "{folder or ""}" }}')
    return write_job(path, *task, model=model, epochs=EPOCHS, extra="[checkpoint]\nkeep = 3")


@pytest.fixture(scope="module")
def uninterrupted(task, tmp_path_factory, project_env_module):
    """The run from start to end: its run directory (checkpoints of epochs 1 to 3), weights and steps per epoch."""
    folder = tmp_path_factory.mktemp("reference")
    run_dir = folder / "run"
    finished = shoal("train", job_file(folder / "job.toml", task), "--workers", 2, "--run-dir", run_dir,
                     env=project_env_module)
    assert finished.returncode == 0, finished.stderr
    return run_dir, weights(run_dir), events(run_dir, "job_start")[0]["steps_per_epoch"]


def flip_a_bit(path: Path, tensor: torch.Tensor) -> None:
    """Flip the highest exponent bit of the first element of `tensor` where the file holds it: a float of 0.1
    becomes about 1e37, still finite, the audit's case; the file still loads."""
    raw = tensor.contiguous().numpy().tobytes()
    content = bytearray(path.read_bytes())
    assert content.count(raw) == 1, "the tensor's bytes are not found once in the file"
    at = content.find(raw) + (tensor.element_size() - 1 if tensor.is_floating_point() else 0)
    content[at] ^= 0x40
    path.write_bytes(bytes(content))
    torch.load(path, weights_only=True)


def weight(state: dict) -> torch.Tensor:
    return state["model"]["inner.0.weight"]


def moment(state: dict) -> torch.Tensor:
    return state["optimizer"]["state"][0]["exp_avg"]


def generator(state: dict) -> torch.Tensor:
    return state["random"]["torch"]


@pytest.mark.parametrize("flips", [
    {"rank-00001.pt": weight},
    {"rank-00000.pt": moment, "rank-00001.pt": generator},
], ids=["weight", "moment-and-generator"])
def test_a_bit_flipped_in_the_newest_checkpoint_resumes_from_the_one_before(uninterrupted, tmp_path, project_env,
                                                                          flips):
    run_dir = shutil.copytree(uninterrupted[0], tmp_path / "run")
    (run_dir / "model.pt").unlink()
    newest = run_dir / "checkpoints" / f"epoch-{EPOCHS:05d}"
    for name, tensor in flips.items():
        flip_a_bit(newest / name, tensor(torch.load(newest / name, weights_only=True)))

    resumed = shoal("train", "--resume", run_dir, "--trust-code", env=project_env)
    assert resumed.returncode == 0, resumed.stderr
    for name in flips:  # named relative to the run directory
        assert f"skipping damaged checkpoint checkpoints/epoch-{EPOCHS:05d}/{name}: its sha256 digest differs" \
            in resumed.stderr, resumed.stderr
    assert [event["from_epoch"] for event in events(run_dir, "job_resumed")] == [EPOCHS - 1]
    assert_same_weights(run_dir, uninterrupted[1])


def test_a_restart_that_fails_at_its_first_step_restarts_from_the_epoch_before(task, uninterrupted, tmp_path,
                                                                              project_env):
    _, reference, steps = uninterrupted
    killed = tmp_path / "killed"
    killed.mkdir()
    job = job_file(tmp_path / "job.toml", task, at=2 * steps + 2, folder=killed)  # in epoch 3, then at once
    run_dir = tmp_path / "run"
    finished = shoal("train", job, "--workers", 2, "--run-dir", run_dir, "--max-restarts", 2, env=project_env)
    assert finished.returncode == 0, finished.stderr
    assert sorted(path.name for path in killed.iterdir()) == ["killed", "killed-again"]
    # restart 1 went on from epoch 2 and failed before its first step: restart 2 went on from epoch 1
    assert [event["from_epoch"] for event in events(run_dir, "job_resumed")] == [2, 1]
    assert [event["from_epoch"] for event in events(run_dir, "job_restarted")] == [2, 1]
    assert ("skipping checkpoint checkpoints/epoch-00002/rank-00001.pt: the last resume from it failed before its "
            "first step") in finished.stderr, finished.stderr
    assert events(run_dir, "job_end")[-1]["status"] == "completed"
    assert_same_weights(run_dir, reference)  # epoch 1's checkpoint is exact too


def test_weights_that_are_not_finite_stop_the_job_before_model_pt(task, tmp_path, project_env):
    model = 'factory = "tests.support.models:with_an_infinite_weight"'
    job = write_job(tmp_path / "job.toml", *task, model=model, epochs=1, algorithm="none")
    run_dir = tmp_path / "run"
    finished = shoal("train", job, "--workers", 1, "--run-dir", run_dir, env=project_env)
    assert finished.returncode == 2, finished.stderr
    last = finished.stderr.strip().splitlines()[-1]
    assert "model.pt not written: the trained weight 'unused' holds 3 non-finite values (of 3)" in last, last
    assert "checkpoint.allow_nonfinite = true" in last
    assert not (run_dir / "model.pt").exists()
    assert events(run_dir, "job_end")[-1]["status"] == "failed"
