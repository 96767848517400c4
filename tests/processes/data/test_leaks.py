"""Nothing left behind by data handling, however the process ends: real processes, really killed.

A share cache without a cache folder keeps its rows in a file with no name, so a kill frees it
and leaves at most an empty folder named by its dead owner, which the next share cache sweeps.
In a kept cache folder, a killed worker's temporaries are swept by the next one. An import
stopped by SIGTERM or SIGINT removes its temporary folder; one killed outright has it swept by
the next write of the same folder. A living owner's temporaries are never touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from shoal.data import leftovers
from shoal.data.cache import ShareCache
from shoal.data.format import DatasetWriter, open_dataset

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")

ROWS = 40
PATIENCE = 60.0  # seconds a started process may take to reach the state a test waits for

SHARE = """
import sys
from shoal.data.cache import ShareCache
from shoal.data.format import open_dataset

dataset = open_dataset(sys.argv[1])
cache = ShareCache(dataset, 0, dataset.rows, cache_dir=sys.argv[2] or None, chunk_rows=4)
print("mapped", flush=True)
sys.stdin.read()  # held until killed
"""

IMPORT = """
import sys
import numpy as np
from shoal.data.format import DatasetWriter

with DatasetWriter(sys.argv[1], (3,), "float32", row_group_size=2) as writer:
    writer.write(np.ones((10, 3)), np.arange(10) % 2)
    print("writing", flush=True)
    sys.stdin.read()  # held until stopped
"""


def dataset(path: Path) -> str:
    with DatasetWriter(str(path), (3,), "float32", rows_per_file=20, row_group_size=4) as writer:
        writer.write(np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3), np.arange(ROWS) % 2)
    return str(path)


def start(code: str, *arguments: str, temporary: Path | None = None) -> subprocess.Popen:
    environment = dict(os.environ, **({"TMPDIR": str(temporary)} if temporary else {}))
    return subprocess.Popen([sys.executable, "-c", code, *arguments], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environment, preexec_fn=default_stop_signals)


def default_stop_signals() -> None:
    """The stop signals as a program started from a terminal has them: a suite run under `nohup` (or in the
    background of a script) passes them on ignored, and shoal rightly leaves an ignored signal ignored."""
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


def wait_for(condition, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the process ended before {what}: {process.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {PATIENCE} s")
        time.sleep(0.02)


def stop(process: subprocess.Popen, number: int) -> int:
    process.send_signal(number)
    status = process.wait(PATIENCE)
    process.stdin.close()
    process.stdout.close()
    process.stderr.close()
    return status


def files_under(folder: Path) -> list[str]:
    return [str(Path(root, name)) for root, _, names in os.walk(folder) for name in names]


def open_into(pid: int, folder: Path) -> bool:
    """Whether the process holds a file open inside `folder` (named or not)."""
    for descriptor in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(descriptor).startswith(f"{folder}/"):
                return True
        except OSError:
            continue
    return False


def starve(part: Path) -> Path:
    """Put a FIFO where a Parquet file was: a reader blocks opening it, as on a store that hangs."""
    aside = part.with_name(part.name + ".aside")
    part.rename(aside)
    os.mkfifo(part)
    return aside


@pytest.fixture
def temporary(tmp_path, monkeypatch) -> Path:
    """The temporary folder, here and in the processes started."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


# ---------------------------------------------------------------- share caches without a cache folder


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_worker_mapping_its_share_leaves_no_file_and_the_next_one_sweeps_its_folder(
        tmp_path, temporary, number):
    path = dataset(tmp_path / "set")
    process = start(SHARE, path, "", temporary=temporary)
    wait_for(lambda: process.stdout.readline() == "mapped\n", process, "the share mapped")
    held = os.listdir(temporary)
    assert [leftovers.owner(name) for name in held] == [process.pid]  # its folder, named by its owner
    assert stop(process, number) == -number
    assert files_under(temporary) == []  # the rows went with the process

    cache = ShareCache(open_dataset(path), 0, ROWS, cache_dir=None, chunk_rows=4)
    assert held[0] not in os.listdir(temporary)  # swept: its owner is gone
    assert files_under(temporary) == []  # this one's rows have no name either
    cache.close()
    assert os.listdir(temporary) == []


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGKILL])
def test_a_worker_killed_while_copying_its_share_leaves_no_file(tmp_path, temporary, number):
    path = dataset(tmp_path / "set")
    aside = starve(Path(path) / "part-00001.parquet")
    process = start(SHARE, path, "", temporary=temporary)
    wait_for(lambda: open_into(process.pid, temporary), process, "the cache file open")
    assert files_under(temporary) == []  # open and being written, yet nameless
    assert stop(process, number) == -number
    assert files_under(temporary) == []
    aside.rename(Path(path) / "part-00001.parquet")
    ShareCache(open_dataset(path), 0, ROWS, cache_dir=None, chunk_rows=4).close()
    assert os.listdir(temporary) == []


# ---------------------------------------------------------------- a kept cache folder


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_workers_temporaries_in_a_cache_folder_are_swept_by_the_next_run(tmp_path, number):
    path = dataset(tmp_path / "set")
    cache_dir = tmp_path / "cache"
    aside = starve(Path(path) / "part-00001.parquet")
    process = start(SHARE, path, str(cache_dir))
    wait_for(lambda: any(name.endswith(".tmp") for name in os.listdir(cache_dir)) if cache_dir.is_dir() else False,
             process, "a temporary in the cache folder")
    other = dataset(tmp_path / "other")
    ShareCache(open_dataset(other), 0, ROWS, cache_dir=str(cache_dir), chunk_rows=4).close()
    stale = [name for name in os.listdir(cache_dir) if name.endswith(".tmp")]
    assert stale and {leftovers.owner(name) for name in stale} == {process.pid}  # a living owner's: kept

    assert stop(process, number) == -number
    assert set(stale) <= set(os.listdir(cache_dir))  # what the kill left
    aside.rename(Path(path) / "part-00001.parquet")
    cache = ShareCache(open_dataset(path), 0, ROWS, cache_dir=str(cache_dir), chunk_rows=4)
    names = os.listdir(cache_dir)
    assert not [name for name in names if name.endswith(".tmp")]
    assert len(names) == 6 and all(name.startswith("share-") for name in names)  # two finished caches
    cache.close()


# ---------------------------------------------------------------- imports


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_an_import_stopped_by_a_signal_leaves_nothing(tmp_path, number):
    out = tmp_path / "out"
    process = start(IMPORT, str(out))
    wait_for(lambda: process.stdout.readline() == "writing\n", process, "the import writing")
    assert [name.startswith(".out.") for name in os.listdir(tmp_path)] == [True]
    assert stop(process, number) == -number  # ended by the signal, as it would have been
    assert os.listdir(tmp_path) == []


def test_an_import_killed_outright_is_swept_by_the_next_write_of_the_folder(tmp_path):
    out = tmp_path / "out"
    process = start(IMPORT, str(out))
    wait_for(lambda: process.stdout.readline() == "writing\n", process, "the import writing")
    killed = os.listdir(tmp_path)
    assert [leftovers.owner(name) for name in killed] == [process.pid]

    alive = start(IMPORT, str(out))  # a second import of the same folder, still running: its folder stays
    wait_for(lambda: alive.stdout.readline() == "writing\n", alive, "the second import writing")
    assert stop(process, signal.SIGKILL) == -signal.SIGKILL
    assert killed[0] in os.listdir(tmp_path) and len(os.listdir(tmp_path)) == 2  # the kill left its folder

    with DatasetWriter(str(out), (3,), "float32") as writer:  # the next write sweeps the dead one's
        writer.write(np.zeros((2, 3)), np.array([0, 1]))
    remaining = os.listdir(tmp_path)
    assert killed[0] not in remaining and "out" in remaining
    assert [leftovers.owner(name) for name in remaining if name != "out"] == [alive.pid]
    assert stop(alive, signal.SIGTERM) == -signal.SIGTERM
    assert os.listdir(tmp_path) == ["out"]
    assert open_dataset(str(out)).rows == 2

