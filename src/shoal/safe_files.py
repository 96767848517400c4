"""Writes that never go through a symbolic link: a run directory or dataset folder is data.

Anyone may have written a run directory (a copied run, a shared scratch folder), and a link
planted where shoal keeps a file (`.lock`, `events.jsonl`, `model.pt`, `checkpoints/`) would
otherwise make shoal append to, overwrite or delete whatever the link points at. So every file
shoal writes there is opened with O_NOFOLLOW (and O_EXCL when it must be new), temporaries get
unpredictable names, created exclusively, and a link where shoal's own file or folder belongs is
refused in one line naming it. Removing a folder removes a link itself, never what it points at.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from shoal.errors import ConfigError

NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def link_refused(path: str | Path) -> ConfigError:
    return ConfigError(f"{path}: a symbolic link where shoal keeps its own file or folder; shoal never writes "
                       "through one (remove the link, or choose another folder)")


def refuse_link(path: str | Path) -> None:
    """A ConfigError naming `path` when it is a symbolic link (a missing path is fine)."""
    if os.path.islink(path):
        raise link_refused(path)


def open_file(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """`os.open` that never follows a link at `path` itself: a link there is a ConfigError naming it."""
    try:
        return os.open(path, flags | NO_FOLLOW, mode)
    except OSError as error:
        if error.errno == errno.ELOOP and os.path.islink(path):
            raise link_refused(path) from None
        raise


def new_temporary(beside: str | Path, suffix: str = ".tmp") -> tuple[int, Path]:
    """(descriptor, path) of a new file with an unpredictable name in `beside`'s folder, created exclusively."""
    beside = Path(beside)
    descriptor, name = tempfile.mkstemp(prefix=f".{beside.name}.", suffix=suffix, dir=beside.parent)
    return descriptor, Path(name)


def make_folder(path: str | Path, exist_ok: bool = False) -> None:
    """Create a folder; one there already is fine with `exist_ok`, a link never (its target is not ours)."""
    refuse_link(path)
    Path(path).mkdir(exist_ok=exist_ok)


def refuse_links_within(folder: str | Path) -> None:
    """A ConfigError naming the first symbolic link at or below `folder`: a library shoal hands a folder to
    (MLflow's file store, TensorBoard's writer) opens its files there by name, through any link it meets."""
    refuse_link(folder)
    for parent, folders, files in os.walk(folder):  # never into a linked folder: it is refused first
        for name in folders + files:
            refuse_link(os.path.join(parent, name))


def remove_tree(path: str | Path) -> None:
    """Remove a folder and what it holds, never anything a link inside it (or the path itself) points at."""
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)  # rmtree removes links inside a folder, not their targets
