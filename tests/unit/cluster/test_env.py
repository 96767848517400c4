"""Who am I: rank discovery from launcher variables, threads, devices, joining the process group."""

from __future__ import annotations

import json
import os
import threading
from datetime import timedelta

import pytest
import torch

import shoal.cluster.device_agreement
import shoal.cluster.env
from shoal.cluster import env
from shoal.cluster.env import DistInfo, choose_device, cores, get_dist_info, init_process_group, threads_per_worker
from shoal.cluster.environments import ENVIRONMENTS
from shoal.cluster.environments.shoal_launcher import LAUNCHER_VARIABLE
from shoal.cluster.interface import SOCKET_VARIABLES
from shoal.errors import ShoalError
from tests.distributed.harness import free_port

LAUNCHER_VARIABLES = [name for environment in ENVIRONMENTS for name in
                      (environment.RANK, environment.SIZE, environment.LOCAL_RANK, environment.LOCAL_SIZE) if name] + [
    "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID",
    "SLURM_GPUS_PER_TASK", "SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE", LAUNCHER_VARIABLE]


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
    """Every test starts as a process started alone, whatever launched pytest; what a join writes straight
    into the environment (the store's address, the interfaces) is put back, or later tests' workers would
    inherit it."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    saved = {name: os.environ.get(name) for name in (*SOCKET_VARIABLES, "MASTER_ADDR", "MASTER_PORT")}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def set_variables(monkeypatch, **variables):
    for name, value in variables.items():
        monkeypatch.setenv(name, str(value))


def place(info: DistInfo) -> tuple[int, int, int, int]:
    return info.rank, info.world_size, info.local_rank, info.local_world_size


# ---------------------------------------------------------------- rank discovery


def test_a_process_started_alone_is_rank_0_of_1():
    assert place(get_dist_info()) == (0, 1, 0, 1)


def test_torchrun_variables(monkeypatch):
    set_variables(monkeypatch, RANK=5, WORLD_SIZE=8, LOCAL_RANK=1, LOCAL_WORLD_SIZE=4)
    assert place(get_dist_info()) == (5, 8, 1, 4)


def test_slurm_variables(monkeypatch):
    set_variables(monkeypatch, SLURM_PROCID=6, SLURM_NTASKS=8, SLURM_LOCALID=2, SLURM_NTASKS_PER_NODE=4)
    assert place(get_dist_info()) == (6, 8, 2, 4)


def test_slurm_tasks_per_node_in_the_repeated_form(monkeypatch):
    # SLURM writes "4(x2)" for "4 tasks on each of 2 nodes"
    set_variables(monkeypatch, SLURM_PROCID=3, SLURM_NTASKS=8, SLURM_LOCALID=3, SLURM_NTASKS_PER_NODE="4(x2)")
    assert place(get_dist_info()) == (3, 8, 3, 4)


def test_open_mpi_variables(monkeypatch):
    set_variables(monkeypatch, OMPI_COMM_WORLD_RANK=2, OMPI_COMM_WORLD_SIZE=3, OMPI_COMM_WORLD_LOCAL_RANK=0,
                  OMPI_COMM_WORLD_LOCAL_SIZE=1)
    assert place(get_dist_info()) == (2, 3, 0, 1)


def test_missing_local_variables_mean_local_rank_0_and_every_worker_on_this_machine(monkeypatch):
    set_variables(monkeypatch, OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=3)
    assert place(get_dist_info()) == (1, 3, 0, 3)


def test_a_launchers_own_variables_come_before_an_outer_allocations(monkeypatch):
    # an sbatch allocation, mpirun inside it, torchrun inside that
    set_variables(monkeypatch, SLURM_PROCID=2, SLURM_NTASKS=6)
    assert get_dist_info().launcher == "SLURM"
    set_variables(monkeypatch, OMPI_COMM_WORLD_RANK=3, OMPI_COMM_WORLD_SIZE=4)
    assert place(get_dist_info())[:2] == (3, 4) and get_dist_info().launcher == "Open MPI"
    set_variables(monkeypatch, RANK=1, WORLD_SIZE=2)
    assert place(get_dist_info())[:2] == (1, 2) and get_dist_info().launcher == "torchrun"


def test_a_launcher_counts_only_with_both_its_rank_and_its_size(monkeypatch):
    set_variables(monkeypatch, RANK=1, SLURM_NTASKS=4)  # half of torchrun's pair, half of SLURM's
    assert place(get_dist_info()) == (0, 1, 0, 1)
    set_variables(monkeypatch, OMPI_COMM_WORLD_RANK=2, OMPI_COMM_WORLD_SIZE=5)
    assert place(get_dist_info())[:2] == (2, 5)


def test_print0_prints_on_rank_0_only(capsys):
    env.print0("shown", info=DistInfo(rank=0, world_size=2))
    env.print0("hidden", info=DistInfo(rank=1, world_size=2))
    assert capsys.readouterr().out == "shown\n"


# ---------------------------------------------------------------- cores and threads


def test_cores_counts_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert cores() == 3


def test_cores_without_an_affinity_mask_counts_the_machine(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert cores() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert cores() == 1


def test_threads_per_worker_shares_the_cores_unless_configured(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert threads_per_worker(3, 4) == 3  # configured wins, even past the cores
    assert threads_per_worker(16, 1) == 16
    assert threads_per_worker(0, 1) == 8
    assert threads_per_worker(0, 4) == 2
    assert threads_per_worker(0, 3) == 2  # 8 // 3
    assert threads_per_worker(0, 16) == 1  # more workers than cores: still one thread each


# ---------------------------------------------------------------- devices


@pytest.fixture
def gpus(monkeypatch):
    """Pretend the machine has `count` GPUs; records the devices set."""
    chosen = []

    def pretend(count: int) -> list:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
        return chosen

    return pretend


def test_auto_without_gpus_is_the_cpu(gpus):
    gpus(0)
    assert choose_device("auto", DistInfo()) == torch.device("cpu")
    assert choose_device("cpu", DistInfo()) == torch.device("cpu")


def test_cuda_without_gpus_names_the_key(gpus):
    gpus(0)
    with pytest.raises(ShoalError, match=r"^cluster\.device: 'cuda' asked for but no CUDA device is available$"):
        choose_device("cuda", DistInfo())


def test_auto_uses_the_gpus_only_when_every_local_worker_gets_one(gpus):
    chosen = gpus(2)
    assert choose_device("auto", DistInfo(rank=3, world_size=4, local_rank=1, local_world_size=2)) == \
        torch.device("cuda", 1)
    assert chosen == [1]
    assert choose_device("auto", DistInfo(rank=3, world_size=4, local_rank=3, local_world_size=4)) == \
        torch.device("cpu")
    assert choose_device("cpu", DistInfo(local_world_size=1)) == torch.device("cpu")
    assert chosen == [1]


def test_cuda_with_more_workers_than_gpus_is_refused(gpus):
    gpus(2)
    with pytest.raises(ShoalError, match=r"cluster\.device: 'cuda' with 3 workers on a machine with 2 GPU\(s\)"):
        choose_device("cuda", DistInfo(rank=0, world_size=3, local_world_size=3))


# ---------------------------------------------------------------- process group


@pytest.fixture
def joins(monkeypatch):
    """Records calls to torch.distributed.init_process_group instead of joining anything."""
    calls = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *args, **kwargs: calls.append((args, kwargs)))
    return calls


def test_a_world_of_one_joins_nothing(joins):
    init_process_group(DistInfo(), torch.device("cpu"), timeout=30)
    assert joins == []
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("present", [{}, {"MASTER_ADDR": "10.0.0.1"}, {"MASTER_PORT": "29500"}])
def test_a_world_of_many_needs_master_addr_and_port(monkeypatch, joins, present):
    set_variables(monkeypatch, OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2, **present)
    # as without mpi4py (MPI itself is never started inside the test process)
    monkeypatch.setattr(shoal.cluster.env, "agree_master", lambda world_size, one_machine: None)
    with pytest.raises(ShoalError, match="must be set for a job started by Open MPI.*mpi4py"):
        init_process_group(get_dist_info(), torch.device("cpu"), timeout=30)
    assert joins == []


def test_under_mpi_rank_0s_address_comes_over_mpi(monkeypatch, joins):
    set_variables(monkeypatch, OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_LOCAL_SIZE=1)
    asked = []
    monkeypatch.setattr(shoal.cluster.env, "agree_master",
                        lambda world_size, one_machine: asked.append((world_size, one_machine)) or ("10.0.0.9", 1234))
    init_process_group(get_dist_info(), torch.device("cpu"), timeout=30)
    assert asked == [(2, False)] and len(joins) == 1
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("10.0.0.9", "1234")


def test_a_world_of_many_on_cpu_joins_with_gloo(monkeypatch, joins):
    set_variables(monkeypatch, MASTER_ADDR="127.0.0.1", MASTER_PORT=29500, RANK=1, WORLD_SIZE=3)
    init_process_group(get_dist_info(), torch.device("cpu"), timeout=45)
    assert joins == [(("gloo",), {"rank": 1, "world_size": 3, "timeout": timedelta(seconds=45), "device_id": None})]


def test_under_auto_a_rank_on_a_gpu_joins_gloo_with_one_on_the_cpu(monkeypatch, joins):
    """The ranks agree in the job's store (rank 0 serves it), then join with it under torch's own prefix."""
    monkeypatch.setattr(shoal.cluster.device_agreement, "gpu_identity",
                        lambda device: "cpu" if device.type == "cpu" else f"GPU-{device.index}")
    master = ("127.0.0.1", free_port())
    set_variables(monkeypatch, MASTER_ADDR=master[0], MASTER_PORT=master[1])
    infos = [DistInfo(rank=rank, world_size=2, local_rank=rank, local_world_size=2, master=master) for rank in range(2)]
    proposals = [torch.device("cuda", 0), torch.device("cpu")]
    joined = [None, None]

    def join(rank: int) -> None:
        try:
            joined[rank] = init_process_group(infos[rank], proposals[rank], timeout=30, requested="auto")
        except Exception as error:  # shown by the assertion below, not lost in the thread
            joined[rank] = error

    threads = [threading.Thread(target=join, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert [getattr(info, "device", info) for info in joined] == ["cpu", "cpu"]
    assert sorted(kwargs["rank"] for _, kwargs in joins) == [0, 1]
    for args, kwargs in joins:
        assert args == ("gloo",) and kwargs["device_id"] is None
        store = kwargs["store"]
        store.set(f"probe/{kwargs['rank']}", "1")
        assert store.underlying_store.get(f"default_pg/probe/{kwargs['rank']}") == b"1"
        claim = json.loads(store.underlying_store.get("shoal/device/0"))
        assert claim == {"host": infos[0].host, "gpu": "GPU-0"}
