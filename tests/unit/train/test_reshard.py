"""Resuming on another number of workers, without processes: ranks are the fake communicator's threads.

Which checkpoint a resume takes (exact while the size is the same, else resharded from rank 0's files,
never from files a returning machine kept of an earlier size or save), and what each rank holds once
resharded: rank 0's state for every rank of a collective algorithm, the server's model for every
trainer of a parameter server, the clocks going on, the speed shares planned anew, the generators
seeded from the checkpoint's epoch, the new size and the rank, and the reshard in `job_resumed`.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch

from shoal.cluster.env import DistInfo
from shoal.cluster.fake import run_ranks
from shoal.events import JobResumed, read_history
from shoal.train.balancer import Balancer
from shoal.train.checkpoint import CHECKPOINTS, Checkpointer, agree_on_latest, load_rank
from shoal.train.reshard import reseed, reshard_seed
from shoal.train.runner import Runner
from tests.unit.train.test_checkpoint import assert_same, rank_state
from tests.unit.train.test_runner import job as tiny_job

# ---------------------------------------------------------------- which checkpoint


def save_on(folders: list[Path], epochs, keep: int = 10) -> None:
    """`len(folders)` ranks, one machine (and folder) each, save checkpoints of `epochs`."""
    hosts = [f"host{rank}" for rank in range(len(folders))]

    def body(comm):
        checkpointer = Checkpointer(folders[comm.rank], comm, keep, hosts=hosts)
        for epoch in epochs:
            checkpointer.save(epoch, rank_state(comm.rank, epoch), {} if comm.rank == 0 else None)

    run_ranks(len(folders), body)


def agree(folders: list[Path]) -> list[tuple[int, bool, int]]:
    """(epoch, resharded, writers' count) of the checkpoint each rank agrees on, rank `r` seeing `folders[r]`."""
    def body(comm):
        with warnings.catch_warnings(record=True):
            found = agree_on_latest(folders[comm.rank], comm, coordinator=comm.rank == 0)
        return found.epoch, found.reshard, found.world_size

    return run_ranks(len(folders), body)


def test_a_checkpoint_of_two_workers_is_resharded_onto_three_one_of_them_holding_nothing(tmp_path):
    hosts = [tmp_path / f"host{index}" for index in range(3)]
    save_on(hosts[:2], (1, 2))
    assert agree(hosts) == [(2, True, 2)] * 3
    assert agree(hosts[:1]) == [(2, True, 2)]  # and onto one
    assert agree(hosts[:2]) == [(2, False, 2)] * 2  # the same size: exact, each rank its own file


def test_files_a_returning_machine_kept_of_an_earlier_size_never_count(tmp_path):
    """3 workers, then 2 (the third machine left with its files of epochs 1-2), then 3 again."""
    hosts = [tmp_path / f"host{index}" for index in range(3)]
    save_on(hosts, (1, 2))
    save_on(hosts[:2], (3, 4))
    assert agree(hosts) == [(4, True, 2)] * 3  # not epoch 2, which every rank holds
    save_on(hosts, (5,))
    assert agree(hosts) == [(5, False, 3)] * 3
    damaged = hosts[2] / CHECKPOINTS / "epoch-00005" / "rank-00002.pt"
    damaged.write_bytes(damaged.read_bytes()[:40])
    # no epoch of 3 workers newer than the 2 workers' is whole: rank 0's epoch 5 for all, never epoch 2
    assert agree(hosts) == [(5, True, 3)] * 3


def test_a_rank_file_of_an_earlier_save_of_the_same_epoch_is_not_taken_for_this_ones(tmp_path):
    hosts = [tmp_path / f"host{index}" for index in range(3)]
    save_on(hosts, (2,))
    kept = tmp_path / "kept"
    (hosts[2] / CHECKPOINTS).rename(kept)  # its machine leaves with its files
    (hosts[2] / CHECKPOINTS).mkdir()
    save_on(hosts, (2,))  # epoch 2 saved again by three workers, another machine third
    (hosts[2] / CHECKPOINTS).rename(tmp_path / "replaced")
    kept.rename(hosts[2] / CHECKPOINTS)  # the first one comes back
    assert agree(hosts) == [(2, True, 3)] * 3  # its file of epoch 2 is of the other save
    assert_same(load_rank(hosts[2] / CHECKPOINTS / "epoch-00002", 2), rank_state(2, 2))  # the id stays inside


# ---------------------------------------------------------------- what each rank holds


def config(tmp_path, algorithm: dict, epochs: int, balance: str = "equal"):
    job = tiny_job(tmp_path, epochs=epochs)
    job.algorithm.name, job.algorithm.options = algorithm["name"], {k: v for k, v in algorithm.items() if k != "name"}
    job.cluster.balance = balance
    return job


def train(job, folders: list[Path]) -> None:
    """The whole job on `len(folders)` ranks, rank r on machine r with its own folder."""
    def body(comm):
        info = DistInfo(rank=comm.rank, world_size=comm.world_size, host=f"host{comm.rank}")
        Runner(job, info, folders[comm.rank], threads=1, comm=comm).run()

    run_ranks(len(folders), body, timeout=30)


def snapshot(runner: Runner) -> dict:
    """What a rank holds once resumed."""
    return copy.deepcopy({"model": runner.model.state_dict(), "optimizer": runner.optimizer.state_dict()["state"],
                          "step": runner.epoch_loop.global_step, "algorithm": runner.algorithm.state_dict(),
                          "plan": runner.plan.shares, "rates": runner.balancer.rates,
                          "lr": runner.optimizer.param_groups[0]["lr"]})


def resume(job, folders: list[Path]) -> list[dict]:
    """The job resumed on `len(folders)` ranks, run to its end; what each rank held once resumed."""
    def body(comm):
        info = DistInfo(rank=comm.rank, world_size=comm.world_size, host=f"host{comm.rank}")
        runner = Runner(job, info, folders[comm.rank], threads=1, resume=True, comm=comm)
        try:
            runner.setup()
            runner.load_data()
            runner.resume()
            held = snapshot(runner)
            runner.start()
            for epoch in range(runner.first_epoch, job.train.epochs):
                runner.end_epoch(epoch, runner.run_epoch(epoch))
            runner.complete()
        finally:
            runner.finish()
        return held

    return run_ranks(len(folders), body, timeout=30)


def assert_resharded(run_dir: Path, written_by: int, world_size: int) -> None:
    history = read_history(run_dir)
    resumed = history.of(JobResumed)
    assert [(event.from_epoch, event.resharded_from, event.world_size) for event in resumed] == \
        [(2, written_by, world_size)]
    assert history.end.status == "completed" and history.end.epochs == 3


SCHEDULE = {"name": "StepLR", "step_size": 1, "gamma": 0.5}


@pytest.mark.parametrize("algorithm", [
    {"name": "sync"},
    {"name": "averaging", "period": 5},
    {"name": "easgd", "synchronous": True, "period": 2, "momentum": 0.5, "elastic_force": 0.3},
], ids=["sync", "averaging", "easgd"])
def test_every_rank_of_a_collective_algorithm_takes_rank_0s_state(tmp_path, algorithm):
    hosts = [tmp_path / f"host{index}" for index in range(3)]
    for host in hosts:
        host.mkdir()
    job = config(tmp_path, algorithm, epochs=2, balance="speed" if algorithm["name"] == "sync" else "equal")
    job.train.scheduler = SCHEDULE
    train(job, hosts[:2])
    written = [load_rank(hosts[rank] / CHECKPOINTS / "epoch-00002", rank) for rank in (0, 1)]
    for name, tensor in written[0]["model"].items():  # the replicas are equal where an epoch ends
        assert algorithm["name"] == "easgd" or torch.equal(tensor, written[1]["model"][name]), name

    job.train.epochs = 3
    held = resume(job, hosts)  # host2 is new: its folder is empty
    rank_0 = written[0]
    for rank, state in enumerate(held):
        if algorithm["name"] == "easgd":  # each replica starts again at the centre
            centre = torch.cat([tensor.reshape(-1) for tensor in state["model"].values()])  # no buffers
            assert torch.equal(centre, rank_0["algorithm"]["centre"]), rank
        else:
            assert_same(state["model"], rank_0["model"])
        assert_same(state["optimizer"], rank_0["optimizer"]["state"])
        assert_same(state["algorithm"], rank_0["algorithm"])
        assert state["step"] == rank_0["global_step"] == 2 * 6  # 48 rows a worker, batch 8: the clock goes on
        assert state["lr"] == pytest.approx(0.01 * 0.5**2)  # the schedule too
        assert state["rates"] is None  # speed shares dropped: planned as a fresh job's
        assert state["plan"] == Balancer(job.cluster.balance, 96, 3, 8, True).plan.shares
    assert algorithm["name"] != "sync" or rank_0["balance"]["rates"] is not None  # the checkpoint held them
    assert_resharded(hosts[0], 2, 3)


@pytest.mark.parametrize("algorithm", [
    {"name": "downpour", "sync_every": 2},
    {"name": "easgd", "synchronous": False, "period": 2, "momentum": 0.5},
], ids=["downpour", "easgd-server"])
def test_every_trainer_of_a_parameter_server_takes_the_servers_model_and_version(tmp_path, algorithm):
    hosts = [tmp_path / f"host{index}" for index in range(3)]
    for host in hosts:
        host.mkdir()
    job = config(tmp_path, algorithm, epochs=2)
    train(job, hosts[:2])  # a server and one trainer
    server = load_rank(hosts[0] / CHECKPOINTS / "epoch-00002", 0)
    assert server["algorithm"]["version"] > 0

    job.train.epochs = 3
    held = resume(job, hosts)  # a server and two trainers
    assert_same(held[0]["model"], server["model"])
    assert_same(held[0]["optimizer"], server["optimizer"]["state"])
    assert_same(held[0]["algorithm"], server["algorithm"])
    for state in held[1:]:
        assert_same(state["model"], server["model"])
        assert state["optimizer"] == {}  # a fresh optimizer
        assert state["algorithm"]["version"] == server["algorithm"]["version"]
        if "velocity" in state["algorithm"]:
            assert not state["algorithm"]["velocity"].any()  # the centre's velocity is the server's
    assert [state["step"] for state in held] == [server["global_step"]] * 3
    assert_resharded(hosts[0], 2, 3)
    ends = [event for event in read_history(hosts[0]).epochs if event.epoch == 3]
    assert [worker.rank for worker in ends[0].workers] == [1, 2]
    assert ends[0].algorithm["version"] == server["algorithm"]["version"] + ends[0].algorithm["updates"]


def test_a_rank_reseeds_from_the_seed_the_checkpoints_epoch_the_new_size_and_its_rank(tmp_path):
    hosts = [tmp_path / "host0", tmp_path / "host1"]
    for host in hosts:
        host.mkdir()
    job = config(tmp_path, {"name": "sync"}, epochs=2)
    train(job, hosts)
    job.train.epochs = 3

    def body(comm):
        runner = Runner(job, DistInfo(host="host0"), hosts[0], threads=1, resume=True, comm=comm)
        try:
            runner.setup()
            runner.load_data()
            runner.resume()
            return torch.rand(4)
        finally:
            runner.finish()
            if runner.heartbeat is not None:
                runner.heartbeat.close()

    drawn = run_ranks(1, body)[0]
    reseed(reshard_seed(job.train.seed, 2, 1, 0))
    assert torch.equal(drawn, torch.rand(4))
    seeds = {reshard_seed(0, epoch, size, rank) for epoch in (1, 2) for size in (2, 3) for rank in (0, 1)}
    assert len(seeds) == 8 and reshard_seed(0, 2, 3, 1) == reshard_seed(0, 2, 3, 1)
