"""The runner's named steps in one process: a world of one, a resume, and a server job on fake ranks.

No worker processes and no process group: `Runner` takes a communicator, so these tests drive
the same steps `python -m shoal.worker` takes, with a world-of-one communicator or the fake's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo
from shoal.cluster.fake import run_ranks
from shoal.jobs import from_dict
from shoal.run.artifacts import load_model
from shoal.train.runner import Runner
from tests.distributed.common import write_dataset


def job(tmp_path, **train):
    train_set, test_set = str(tmp_path / "train"), str(tmp_path / "test")
    if not (tmp_path / "train").exists():
        write_dataset(train_set, rows=96, seed=1)
        write_dataset(test_set, rows=30, seed=2)
    return from_dict({
        "model": {"layers": [{"dense": 8, "activation": "tanh"}, {"dropout": 0.2}, {"dense": 3}]},
        "data": {"train": train_set, "test": test_set},
        "train": {"epochs": 3, "batch_size": 8, "optimizer": {"name": "adam", "lr": 0.01}, **train},
        "output": {"progress": "none"},
    }, name="tiny")


def events(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def weights(run_dir) -> dict:
    return load_model(run_dir).state_dict()


def world_of_one(tmp_path) -> tuple[Runner, Path]:
    """A runner of the tiny job as rank 0 of 1, and its run directory."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return Runner(job(tmp_path), DistInfo(), run_dir, threads=1, comm=Communicator(0, 1)), run_dir


def test_a_job_runs_through_the_named_steps_in_process(tmp_path):
    runner, run_dir = world_of_one(tmp_path)
    try:
        runner.setup()
        runner.load_data()
        runner.resume()
        # a slow data load must not leave an empty events file that `shoal status` reads as a stalled job
        assert not (run_dir / "events.jsonl").exists()
        runner.start()
        assert [record["event"] for record in events(run_dir)] == ["job_start", "data_loaded"]
        for epoch in range(3):
            runner.end_epoch(epoch, runner.run_epoch(epoch))
            assert runner.epoch_loop.global_step == (epoch + 1) * runner.steps  # the trainer counts its steps
        metrics = runner.complete()
    finally:
        runner.finish()
    kinds = [record["event"] for record in events(run_dir)]
    assert kinds == ["job_start", "data_loaded"] + ["epoch_end", "checkpoint"] * 3 + ["job_end"]
    assert set(metrics) >= {"loss", "accuracy"}
    assert sorted(path.name for path in (run_dir / "checkpoints").iterdir()) == ["epoch-00002", "epoch-00003"]


def test_a_failing_rank_beats_on_until_its_process_ends(tmp_path):
    """Its heartbeat must not stop first: the failure would be blamed on it going quiet."""
    runner, _ = world_of_one(tmp_path)

    def broken(epoch):
        raise RuntimeError("boom")

    runner.run_epoch = broken
    with pytest.raises(RuntimeError, match="boom"):
        runner.run()
    assert runner.heartbeat.beating
    runner.heartbeat.close()


def test_a_failing_rank_says_it_leaves_so_its_end_is_not_taken_for_a_hang(tmp_path):
    runner, _ = world_of_one(tmp_path)

    def broken(epoch):
        raise ValueError("its own error")

    runner.run_epoch = broken
    with pytest.raises(ValueError):
        runner.run()
    assert runner.heartbeat.leaving and runner.heartbeat.beating
    runner.heartbeat.close()


def test_the_heartbeat_keeps_watch_with_the_jobs_stall_timeout_when_told_what_to_do(tmp_path):
    """shoal.worker hands `on_stall` (it leaves); a runner driven in-process without one judges nobody."""
    def heartbeat(**given):
        runner = Runner(job(tmp_path), DistInfo(), tmp_path, threads=1, comm=Communicator(0, 1), **given)
        runner.job.cluster.stall_timeout = 12.0
        runner.setup()
        runner.heartbeat.close()
        return runner.heartbeat

    def on_stall(quiet):
        pass

    watching = heartbeat(on_stall=on_stall)
    assert (watching.stall_timeout, watching.on_stall) == (12.0, on_stall)
    assert heartbeat().stall_timeout is None


def test_a_resumed_job_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir()
    parts.mkdir()
    Runner(job(tmp_path), DistInfo(), whole, threads=1, comm=Communicator(0, 1)).run()
    Runner(job(tmp_path, epochs=2), DistInfo(), parts, threads=1, comm=Communicator(0, 1)).run()
    Runner(job(tmp_path), DistInfo(), parts, threads=1, resume=True, comm=Communicator(0, 1)).run()
    for name, tensor in weights(whole).items():
        assert torch.equal(tensor, weights(parts)[name]), name  # bit for bit, dropout included
    resumed = [record for record in events(parts) if record["event"] == "job_resumed"]
    assert [record["from_epoch"] for record in resumed] == [2]


def test_a_server_job_runs_on_fake_ranks(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = job(tmp_path, epochs=2)
    config.algorithm.name, config.algorithm.options = "downpour", {"sync_every": 2}

    def rank(comm):
        info = DistInfo(rank=comm.rank, world_size=comm.world_size, host="host-a")
        return Runner(config, info, run_dir, threads=1, comm=comm).run()

    results = run_ranks(3, rank, timeout=30)
    assert set(results[0]) >= {"loss", "accuracy"} and results[1] == {} and results[2] == {}
    ends = [record for record in events(run_dir) if record["event"] == "epoch_end"]
    assert [[worker["rank"] for worker in end["workers"]] for end in ends] == [[1, 2], [1, 2]]
    assert [end["step"] for end in ends] == [6, 12]  # 48 rows per trainer, batch 8
    updates = [end["algorithm"]["updates"] for end in ends]
    assert updates == [6, 6]  # 3 exchanges per trainer per epoch (every 2 of 6 steps), two trainers
