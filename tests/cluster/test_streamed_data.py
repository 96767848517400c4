"""A fixed 2-host job (`--nnodes 2`) whose data sits on host0 alone, on the emulated cluster.

Each host's /tmp is its own: the dataset written into host0's is at /tmp/data-streamed there and nowhere on
host1. host1 says so as it joins, host0 starts its data server once both met, and host1's worker streams its
share: the job ends with exactly the weights of the same job run with a copy of the data on both hosts, where
host0 serves nothing (no server line, no streamed bytes).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from shoal.events import read_events
from shoal.run.artifacts import load_model
from tests.cluster.jobs import JOB_SECONDS, log_of, train_on_two_hosts, write_job
from tests.distributed.common import write_dataset

SEEN = Path("/tmp/data-streamed")  # where both hosts look for the data
SERVES = "host0 serves the job's datasets to host1, which lack them"


def streamed_bytes(run_dir: Path) -> list[int]:
    """The bytes each worker streamed from host0's data server as it loaded its share (0: read locally)."""
    loaded = [event for event in read_events(run_dir) if event["event"] == "data_loaded"][-1]
    return [holding.get("streamed_bytes", 0) for holding in loaded["shares"]]


@pytest.mark.timeout(4 * JOB_SECONDS)  # two jobs of at most JOB_SECONDS each, and the cluster's setup
def test_data_on_host0_only_trains_to_the_weights_of_data_on_both(two_hosts, project_env):
    cluster = two_hosts
    data = cluster.private(0) / SEEN.name
    write_dataset(data / "train", rows=600, seed=1)
    write_dataset(data / "test", rows=120, seed=2)
    job = write_job(cluster.shared, "sync", SEEN / "train", SEEN / "test")  # seeded: two runs end alike
    alone, copied = cluster.shared / "run-data-on-host0", cluster.shared / "run-data-on-both"
    assert not (cluster.private(1) / SEEN.name).exists()
    train_on_two_hosts(cluster, job, alone, project_env)
    shutil.copytree(data, cluster.private(1) / SEEN.name)
    try:
        train_on_two_hosts(cluster, job, copied, project_env)
    finally:
        shutil.rmtree(cluster.private(1) / SEEN.name)
    assert SERVES in log_of(cluster, alone, 0)
    assert "serves the job's datasets" not in log_of(cluster, copied, 0)  # every host held them: no server
    streamed = streamed_bytes(alone)
    assert streamed[0] == 0 and streamed[1] > 0, streamed  # host1's worker, from host0
    assert streamed_bytes(copied) == [0, 0]
    for (name, tensor), other in zip(load_model(alone).state_dict().items(), load_model(copied).state_dict().values()):
        assert torch.equal(tensor, other), name
