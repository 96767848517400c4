"""The ranks' agreement on devices: every rank on its own GPU keeps it, a GPU claimed twice or a rank
without one puts an "auto" job on the CPU and refuses a "cuda" one in one line; the agreement runs over a
real store, one thread per rank (GPUs stand in by their UUIDs: this machine may have none)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import shoal.cluster.device_agreement as agreement
from shoal.cluster.device_agreement import agree_device, gpus_unusable, settle
from shoal.cluster.env import DistInfo, choose_device
from shoal.errors import ShoalError
from tests.distributed.harness import free_port


def claims(*gpus: str, host: str = "node-a") -> list[dict]:
    return [{"host": host, "gpu": gpu} for gpu in gpus]


@pytest.mark.parametrize("requested", ["auto", "cuda"])
def test_every_rank_on_a_gpu_of_its_own_keeps_it(requested):
    assert settle(requested, claims("GPU-1", "GPU-2") + claims("GPU-3", host="node-b")) == "own"


def test_auto_puts_the_job_on_the_cpu_where_two_ranks_would_share_a_gpu():
    assert settle("auto", claims("GPU-1") + claims("GPU-1", host="node-a-again")) == "cpu"


def test_auto_puts_the_job_on_the_cpu_where_a_rank_has_no_gpu():
    assert settle("auto", claims("GPU-1") + claims("cpu", host="node-b")) == "cpu"
    assert settle("auto", claims("cpu", "cpu")) == "cpu"
    assert gpus_unusable(claims("GPU-1") + claims("cpu", host="node-b")) == "rank 1 on node-b has no GPU"
    assert gpus_unusable(claims("cpu", "cpu")) == "rank 0 on node-a has no GPU"
    assert gpus_unusable(claims("GPU-1", "GPU-2")) is None


def test_cuda_with_a_gpu_claimed_twice_is_one_line_naming_the_ranks_and_host():
    message = ("cluster.device: 'cuda' but ranks 1 and 2 on node-b share one GPU (NCCL takes one GPU per rank): "
               "run one node per machine, show each node its own GPUs (CUDA_VISIBLE_DEVICES), or set "
               "cluster.device = 'cpu'")
    with pytest.raises(ShoalError) as raised:
        settle("cuda", claims("GPU-1") + claims("GPU-2", "GPU-2", host="node-b"))
    assert str(raised.value) == message


def agreed(proposals: list[torch.device], requested: str, hosts: list[str], stores=None) -> list:
    """Each rank's answer of `agree_device` (a device, or its error's message), the ranks as threads sharing one
    store, or each using its own of `stores` (one per rank)."""
    shared, answers = dist.HashStore(), [None] * len(proposals)

    def rank(index: int) -> None:
        store = stores(index) if stores else shared
        try:
            answers[index] = agree_device(requested, proposals[index], store, index, len(proposals), hosts[index])
        except Exception as error:  # its message only: a kept traceback would keep the rank's store open
            answers[index] = f"{type(error).__name__}: {error}"

    threads = [threading.Thread(target=rank, args=(index,)) for index in range(len(proposals))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), answers
    return answers


@pytest.fixture
def machine_gpus(monkeypatch):
    """GPU i of the machine `cuda:i` is identified as GPU-i: two nodes on one machine see the same ones."""
    monkeypatch.setattr(agreement, "gpu_identity", lambda device: "cpu" if device.type == "cpu" else
                        f"GPU-{device.index}")


def test_two_nodes_on_one_machine_share_its_gpu_and_agree_on_the_cpu(machine_gpus, capfd):
    answers = agreed([torch.device("cuda", 0)] * 2, "auto", ["box", "box"])
    assert answers == [torch.device("cpu")] * 2
    assert capfd.readouterr().err == (
        "shoal: cluster.device 'auto': the job trains on the CPU: ranks 0 and 1 on box share one GPU (NCCL takes "
        "one GPU per rank): run one node per machine, show each node its own GPUs (CUDA_VISIBLE_DEVICES), or set "
        "cluster.device = 'cpu'\n")
    refused = agreed([torch.device("cuda", 0)] * 2, "cuda", ["box", "box"])
    assert all(answer.startswith("ShoalError: cluster.device: 'cuda' but ranks 0 and 1 on box share one GPU")
               for answer in refused), refused


def test_ranks_on_gpus_of_their_own_keep_them(machine_gpus):
    proposals = [torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cuda", 2)]
    assert agreed(proposals, "auto", ["box"] * 3) == proposals


def test_a_machine_without_gpus_puts_the_others_on_the_cpu_too(machine_gpus, capfd):
    answers = agreed([torch.device("cuda", 0), torch.device("cpu")], "auto", ["gpu-box", "cpu-box"])
    assert answers == [torch.device("cpu")] * 2
    notice = "shoal: cluster.device 'auto': the job trains on the CPU: rank 1 on cpu-box has no GPU\n"
    assert capfd.readouterr().err == notice


def test_a_job_without_gpus_trains_on_the_cpu_without_a_word(capfd):
    assert agreed([torch.device("cpu")] * 2, "auto", ["box-a", "box-b"]) == [torch.device("cpu")] * 2
    assert capfd.readouterr().err == ""


class SlowReader:
    """A rank's store that is slow to read the claims (a loaded machine): the store's server, rank 0, must
    outlast the reading, even when it has an error to raise."""

    def __init__(self, store: dist.Store):
        self.store = store

    def __getattr__(self, name):
        return getattr(self.store, name)

    def multi_get(self, keys):
        time.sleep(0.5)
        return self.store.multi_get(keys)


def test_rank_0_serves_the_store_until_every_rank_has_read_the_claims(machine_gpus):
    port = free_port()

    def store(rank: int):
        served = dist.TCPStore("127.0.0.1", port, 3, is_master=rank == 0, timeout=timedelta(seconds=20))
        return served if rank == 0 else SlowReader(served)

    answers = agreed([torch.device("cuda", 0)] * 3, "cuda", ["box"] * 3, stores=store)
    assert all(answer.startswith("ShoalError: cluster.device: 'cuda' but ranks 0 and 1 on box share one GPU")
               for answer in answers), answers


def test_cuda_with_a_rank_without_a_gpu_is_one_line():
    with pytest.raises(ShoalError, match=r"^cluster\.device: 'cuda' but rank 1 on node-b has no GPU$"):
        settle("cuda", claims("GPU-1") + claims("cpu", host="node-b"))


def test_a_joined_rank_uses_the_device_agreed_on():
    assert choose_device("auto", DistInfo(rank=1, world_size=2, device="cpu")) == torch.device("cpu")
