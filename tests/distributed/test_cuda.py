"""The parameter-server algorithms on CUDA: NCCL for the collectives, a gloo group for the messages.

Each rank joins as shoal's workers do (`init_process_group` on its own GPU), so the default group
is NCCL and the servers' messages go over the gloo group beside it, copied to and from the GPU.
Downpour (asynchronous and synchronous) and asynchronous EASGD train to finite parameters on the
GPU with every update accounted for. NCCL takes one GPU per rank: elsewhere the tests are skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from shoal.algorithms import make_algorithm
from shoal.cluster.collectives import Communicator, message_group
from shoal.cluster.env import DistInfo, choose_device, init_process_group
from shoal.data.format import open_dataset
from shoal.data.loader import ShardLoader
from shoal.data.partition import steps_per_epoch
from shoal.process import end_process
from shoal.train.loop import Trainer
from shoal.train.objective import Objective
from tests.distributed.common import CLASSES, small_model, write_dataset
from tests.distributed.harness import run_processes

BATCH, SEED, EPOCHS, WORLD = 8, 3, 2, 3


def need_gpus(count: int) -> None:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < count or not dist.is_nccl_available():
        pytest.skip(f"needs CUDA with {count} GPUs: NCCL takes one GPU per rank "
                    f"(this machine has {gpus}{'' if dist.is_nccl_available() else ' and no NCCL'})")


def _join_on_gpu(rank: int, world_size: int, port: int, folder: str, function, args) -> None:
    """The harness's entry as a shoal worker joins: its own GPU, NCCL, and the gloo group for messages."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    info = DistInfo(rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size,
                    master=("127.0.0.1", port))
    device = choose_device("cuda", info)
    init_process_group(info, device, timeout=60)
    try:
        result = function(rank, world_size, device, *args)
        torch.save(result, Path(folder) / f"result-{rank}.pt")
    finally:
        dist.destroy_process_group()
    end_process(0)  # as the harness's entry: no interpreter teardown after the result is saved


def serve_or_train(rank, world_size, device, path, name, options):
    """One rank on its GPU: the server serves, the trainers train."""
    model = small_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    comm = Communicator(rank, world_size, device=device)
    algorithm = make_algorithm(name, options)
    algorithm.check(world_size)
    algorithm.setup(model, optimizer, comm)
    trainers = algorithm.trainer_ranks(world_size)
    dataset = open_dataset(path)
    algorithm.plan(steps_per_epoch(dataset.rows, len(trainers), BATCH))
    if rank in trainers:
        loader = ShardLoader(dataset, rank=trainers.index(rank), world_size=len(trainers), batch_size=BATCH,
                             seed=SEED, device=device)
        trainer = Trainer(model, optimizer, Objective("cross_entropy", CLASSES), algorithm, loader, comm)
        for epoch in range(EPOCHS):
            trainer.train_epoch(epoch)
    else:
        for epoch in range(EPOCHS):
            algorithm.serve_epoch(epoch)
    return {"devices": {str(p.device) for p in model.parameters()},
            "parameters": [p.detach().cpu() for p in model.parameters()],
            "backends": (dist.get_backend(), dist.get_backend(message_group())),
            "report": algorithm.epoch_report(), "version": algorithm.version}


@pytest.mark.parametrize(("name", "options", "updates"), [
    ("downpour", {"sync_every": 4}, 2 * 2 * EPOCHS),  # 6 steps: 2 updates per trainer and epoch (4 + the 2 left)
    ("downpour", {"synchronous": True}, 6 * EPOCHS),  # one round per step, both trainers in each
    ("easgd", {"elastic_force": 0.3, "period": 3, "momentum": 0.5}, 2 * 2 * EPOCHS),  # 6 steps: 2 rounds each
])
def test_parameter_servers_train_on_cuda_with_messages_over_gloo(tmp_path, name, options, updates):
    need_gpus(WORLD)
    path = write_dataset(tmp_path / "data", rows=96)  # 2 trainers x 48 rows: 6 steps an epoch
    results = run_processes(serve_or_train, WORLD, path, name, options, timeout=240, entry=_join_on_gpu)
    server = results[0]
    assert server["version"] == updates
    assert server["report"]["updates"] == (updates * 2 if options.get("synchronous") else updates)
    for rank, result in enumerate(results):
        assert result["devices"] == {f"cuda:{rank}"}
        assert result["backends"] == ("nccl", "gloo")
        assert all(torch.isfinite(p).all() for p in result["parameters"])
