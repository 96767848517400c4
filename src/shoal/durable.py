"""Files that survive a crash: written whole under a temporary name, flushed to disk, then renamed.

A rename alone is atomic but not durable: after a power cut the new name may point at nothing
written yet, or the rename itself may be lost. So the content is fsynced before the rename and
the folder after it. Everything a run directory or dataset keeps (checkpoints, model.pt, job.toml,
meta.json) goes through here.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def sync_file(path: str | Path) -> None:
    """Flush a file's content to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def sync_folder(path: str | Path) -> None:
    """Flush a folder's entries (a name created, renamed or removed in it) to disk."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def sync_tree(path: str | Path) -> None:
    """Flush a folder of files (one level, as a checkpoint folder is) and the folder itself."""
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            sync_file(entry.path)
    sync_folder(path)


def replace_durably(temporary: str | Path, path: str | Path) -> None:
    """Rename a fully written file or folder over `path`, durable once this returns."""
    temporary = Path(temporary)
    if temporary.is_dir():
        sync_tree(temporary)
    else:
        sync_file(temporary)
    os.replace(temporary, path)
    sync_folder(Path(path).parent)


def write_bytes_durably(path: str | Path, content: bytes) -> None:
    """Write `path` whole or not at all: a temporary file in the same folder, flushed, then renamed."""
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def write_text_durably(path: str | Path, text: str) -> None:
    write_bytes_durably(path, text.encode("utf-8"))
