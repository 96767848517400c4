"""Checkpoints meeting real processes: a writer that died (a real, ended process's pid) and a real full disk."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from shoal.cluster.collectives import Communicator
from shoal.train.checkpoint import CHECKPOINTS, Checkpointer, CheckpointFull
from tests.unit.train.test_checkpoint import epochs_on_disk, leftovers_of, save_alone


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a small tmpfs needs root")
def test_a_real_full_disk_at_a_checkpoint(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        checkpointer = Checkpointer(disk, Communicator(0, 1), keep=5)
        with pytest.raises(CheckpointFull, match=rf"^{re.escape(str(disk))}: the disk is full"):
            checkpointer.save(1, {"model": {"weight": torch.zeros(1_000_000)}}, {})  # 4 MB on a 1 MB disk
        assert leftovers_of(disk) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_dead_writers_temporary_folder_is_swept(tmp_path):
    save_alone(tmp_path, 1)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = tmp_path / CHECKPOINTS / f".epoch-00002.{socket.gethostname()}.{dead.stdout.strip()}.0a1b2c3d.tmp"
    leftover.mkdir()
    (leftover / "rank-00000.pt").write_bytes(b"half a file")
    save_alone(tmp_path, 2)
    assert leftovers_of(tmp_path) == [] and epochs_on_disk(tmp_path) == ["epoch-00001", "epoch-00002"]
