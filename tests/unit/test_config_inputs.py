"""What a user gives `shoal.fit` or `--set` that shoal cannot use: one line naming the key or argument and
what it accepts, found in the launcher before any worker starts; and the paths a run keeps for a resume."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import shoal.launching
from shoal.api import resolve_job, resumed_job, start
from shoal.cli import main
from shoal.cluster.node import supervisor
from shoal.data.format import DatasetWriter
from shoal.errors import ConfigError
from shoal.fit_inputs import check_data_kept, code_arguments, datasets_on_disk
from shoal.train.prepare import check_optimizer, prepare

ROWS = 64


def write_dataset(path: Path) -> Path:
    features = np.random.default_rng(0).normal(size=(ROWS, 4)).astype(np.float32)
    with DatasetWriter(str(path), (4,), "float32") as writer:
        writer.write(features, np.arange(ROWS) % 2)
    return path


def job_table(**cluster) -> dict:
    return {"model": {"layers": [{"dense": 2}]}, "data": {"train": "train"}, "train": {"epochs": 1},
            "checkpoint": {"every": 0}, "output": {"progress": "none"}, "cluster": cluster}


@pytest.fixture
def no_workers(monkeypatch):
    """start() up to the point where it would start workers: the plans it would have started."""
    plans = []
    monkeypatch.setattr(supervisor, "supervise", lambda job, nodes, hooks: plans.append(job))
    return plans


@pytest.mark.parametrize(("override", "message"), [
    ("train.optimizer.lr=abc", "train.optimizer.lr: expected a number, got 'abc'"),
    ("train.optimizer.betas=0.9", "train.optimizer.betas: expected a list of 2 numbers, e.g. [0.9, 0.999], got 0.9"),
    ("train.optimizer.betas=[0.9]",
     "train.optimizer.betas: expected a list of 2 numbers, e.g. [0.9, 0.999], got [0.9]"),
    ("train.optimizer.amsgrad=1", "train.optimizer.amsgrad: expected true or false, got 1"),
    ("train.optimizer.weight_decay=\"0.1\"", "train.optimizer.weight_decay: expected a number, got '0.1'"),
])
def test_an_optimizer_value_of_the_wrong_type_names_the_key_and_the_type(override, message):
    job = resolve_job({"model": {"layers": [{"dense": 2}]}, "data": {"train": "train"},
                       "train": {"optimizer": {"name": "adam"}}}, [override])
    with pytest.raises(ConfigError) as refused:
        check_optimizer(job.train.optimizer, [torch.zeros(1, requires_grad=True)])
    assert str(refused.value) == message


def test_optimizer_values_of_the_right_type_pass():
    job = resolve_job({"model": {"layers": [{"dense": 2}]}, "data": {"train": "train"}},
                      ["train.optimizer.name=adam", "train.optimizer.lr=1", "train.optimizer.betas=[0.8, 0.99]",
                       "train.optimizer.amsgrad=true"])
    check_optimizer(job.train.optimizer, [torch.zeros(1, requires_grad=True)])


def test_a_loss_that_is_neither_a_name_nor_callable_says_what_is_accepted():
    with pytest.raises(ConfigError) as refused:
        shoal.fit(model=[{"dense": 2}], train="unused", loss=3)
    assert str(refused.value) == ("loss: expected a name or a function of (outputs, labels), got int: give a torch "
                                  "loss by name (cross_entropy, binary_cross_entropy, mse, or a torch.nn class like "
                                  "'SmoothL1Loss'), a callable, or your function as 'package.module:function'")


def test_fits_code_arguments_become_references_to_files_in_the_run_directory():
    def my_loss(outputs, labels):
        return outputs.sum()

    table = {}
    pending = code_arguments(table, step=lambda model, batch: 0, loss=my_loss, transform="augment:jitter",
                             scheduler=lambda optimizer: None, metrics={"f1": "metrics:f1", "pr": my_loss})
    assert table == {"train": {"step": "train.step.pkl", "loss": "train.loss.pkl",
                               "scheduler": {"factory": "train.scheduler.factory.pkl"},
                               "metrics": {"f1": "metrics:f1", "pr": "train.metrics.pr.pkl"}},
                     "data": {"transform": "augment:jitter"}}
    assert set(pending) == {"train.step.pkl", "train.loss.pkl", "train.scheduler.factory.pkl",
                            "train.metrics.pr.pkl"}
    with pytest.raises(ConfigError, match=r"^train.step: expected a function of \(model, batch\), got int$"):
        code_arguments({}, step=3)


def test_version(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out.strip() == f"shoal {shoal.__version__}"


def test_cuda_without_a_gpu_is_refused_once_before_any_worker_starts(tmp_path, monkeypatch, no_workers, capsys):
    monkeypatch.chdir(tmp_path)
    write_dataset(tmp_path / "train")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # as on this machine, or one whose GPU is gone
    job = resolve_job(job_table(device="cuda"))
    with pytest.raises(ConfigError) as refused:
        start(job, tmp_path / "run")
    assert str(refused.value) == ("cluster.device: 'cuda' asked for but this machine has no CUDA device that "
                                  "torch can use: set it to \"cpu\" or \"auto\"")
    assert no_workers == [] and not (tmp_path / "run").exists()
    assert capsys.readouterr().err == ""  # the launcher's one line is the caller's to print, once


def test_the_run_keeps_absolute_data_paths_so_a_resume_from_another_folder_reads_them(tmp_path, monkeypatch,
                                                                                        no_workers):
    started_in, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_dataset(started_in / "train")
    write_dataset(started_in / "test")
    monkeypatch.chdir(started_in)
    table = job_table() | {"data": {"train": "train", "test": "./test", "cache_dir": "cache"}}
    start(resolve_job(table), started_in / "run")
    monkeypatch.chdir(elsewhere)
    job = resumed_job(started_in / "run")
    assert (job.data.train, job.data.test, job.data.cache_dir) == (
        str(started_in / "train"), str(started_in / "test"), str(started_in / "cache"))
    prepared = prepare(job)  # what the resume reads first: the data, from here
    assert prepared.train_set.rows == ROWS and prepared.test_set.rows == ROWS
    assert os.getcwd() == str(elsewhere) and len(no_workers) == 1


def test_a_uri_is_kept_as_it_is(tmp_path, monkeypatch, no_workers):
    monkeypatch.setattr(shoal.launching, "prepare", lambda *_, **__: (_ for _ in ()).throw(ConfigError("stop here")))
    job = resolve_job(job_table() | {"data": {"train": "s3://bucket/train"}})
    with pytest.raises(ConfigError, match="stop here"):
        start(job, tmp_path / "run")
    assert job.data.train == "s3://bucket/train"


def test_resuming_a_fit_run_whose_data_was_in_memory_says_how_to_give_it_again(tmp_path):
    features = np.ones((ROWS, 4), dtype=np.float32)
    with datasets_on_disk({}, (features, np.arange(ROWS) % 2), None, None) as table:
        job = resolve_job(job_table() | {"data": table["data"]})
    with pytest.raises(ConfigError) as refused:
        check_data_kept(job, "run/job.toml")
    assert str(refused.value) == (
        "run/job.toml: data.train: the run was trained by shoal.fit on data held in memory, removed when fit "
        "returned; give it again as a dataset folder: --set data.train=FOLDER "
        "(shoal.resume(run, overrides=['data.train=FOLDER']))")
