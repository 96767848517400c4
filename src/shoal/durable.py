"""Files that survive a crash: written whole under a temporary name, flushed to disk, then renamed.

A rename alone is atomic but not durable: after a power cut the new name may point at nothing
written yet, or the rename itself may be lost. So the content is fsynced before the rename and
the folder after it. Everything a run directory or dataset keeps (checkpoints, model.pt, job.toml,
meta.json) goes through here. No write here follows a link at the path written
(`shoal.safe_files`), and a full disk is told apart from other failures (`disk_full`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from shoal.safe_files import new_temporary, refuse_link

FULL = (errno.ENOSPC, errno.EDQUOT)
FULL_TEXT = tuple(os.strerror(number) for number in FULL)  # pyarrow and torch pass the text, not the number


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


def write_durably(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Write `path` whole or not at all: `write(handle)` fills a new temporary file (an unpredictable
    name, created exclusively) in the same folder, flushed, then renamed over `path`. A link at `path`
    is refused (ConfigError) rather than replaced."""
    path = Path(path)
    refuse_link(path)
    descriptor, temporary = new_temporary(path)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def write_bytes_durably(path: str | Path, content: bytes) -> None:
    write_durably(path, lambda handle: handle.write(content))


def write_text_durably(path: str | Path, text: str) -> None:
    write_bytes_durably(path, text.encode("utf-8"))


def disk_full(error: BaseException) -> bool:
    """Whether `error`, or one it arose from, says the disk (or the user's quota) is full.

    torch reports a failed write as "enforce fail ... unexpected pos", with the OSError of the file it
    was given as the context; pyarrow puts the errno's text in its message."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in FULL:
            return True
        if any(text in str(error) for text in FULL_TEXT):
            return True
        error = error.__cause__ or error.__context__
    return False
