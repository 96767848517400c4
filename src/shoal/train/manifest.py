"""Digests of a checkpoint folder's files, so that a file changed after it was written is never loaded.

torch reads a file whose bits flipped on disk without a word when the flip lands in a tensor's bytes
(a weight of 0.1 becomes 2.4e37), and training goes on from it. So each rank hashes its file
(sha256) as it writes it, and the keeper of each checkpoint folder (see `checkpoint`) writes
`manifest.json` beside the files: every file of that folder and its digest. The manifest is written
into the folder before it is renamed into place and flushed to disk like the files, so a folder in
place has its manifest. A file is loaded only once its bytes hash to the recorded digest
(`verify`): a flipped bit, a truncated, missing or replaced file, or one the manifest does not name,
is told apart from a good one before torch reads it. A folder without a manifest was written before
shoal recorded digests: its files are read as before, with the checks on their content alone
(`state_checks`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from shoal.safe_files import open_file

MANIFEST = "manifest.json"
ALGORITHM = "sha256"
DIGEST = re.compile(r"[0-9a-f]{64}")


class Hashing:
    """A file handle that hashes what is written through it (torch.save writes through `write` and `flush`)."""

    def __init__(self, handle):
        self.handle = handle
        self.hash = hashlib.new(ALGORITHM)

    def write(self, data) -> int:
        self.hash.update(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()

    def hexdigest(self) -> str:
        return self.hash.hexdigest()


def file_digest(path: Path) -> str:
    """The digest of a file's bytes, read without following a link at `path`."""
    with os.fdopen(open_file(path, os.O_RDONLY), "rb") as handle:
        return hashlib.file_digest(handle, ALGORITHM).hexdigest()


def write_manifest(folder: Path, digests: dict[str, str], save: str | None) -> None:
    """A new manifest in `folder` (still under its temporary name) naming each file's digest, flushed to disk."""
    content = json.dumps({"algorithm": ALGORITHM, "save": save, "files": dict(sorted(digests.items()))}, indent=1)
    with os.fdopen(open_file(folder / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as handle:
        handle.write(content.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


def recorded(folder: Path) -> tuple[dict[str, str] | None, str]:
    """(file name -> digest, "") from the folder's manifest; (None, "") without one (written before manifests);
    (None, why) for one that cannot be read."""
    path = folder / MANIFEST
    if not os.path.lexists(path):
        return None, ""
    try:
        with os.fdopen(open_file(path, os.O_RDONLY), "rb") as handle:
            content = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError) as error:  # unreadable, not UTF-8, not JSON
        return None, f"its {MANIFEST} cannot be read ({type(error).__name__})"
    content = content if isinstance(content, dict) else {}
    files = content.get("files")
    if content.get("algorithm") != ALGORITHM or not isinstance(files, dict) or not all(
            isinstance(name, str) and isinstance(digest, str) and DIGEST.fullmatch(digest)
            for name, digest in files.items()):
        return None, f"its {MANIFEST} is damaged (expected {ALGORITHM} digests of its files)"
    return files, ""


def verify(path: Path) -> str:
    """"" when the file at `path` is as its folder's manifest records it (or the folder has none), else why not.
    An OSError reading it (a missing file) is raised."""
    digests, problem = recorded(path.parent)
    if problem:
        return problem
    if digests is None:
        return ""
    if path.name not in digests:
        if not os.path.lexists(path):
            raise FileNotFoundError(2, "No such file or directory")
        return f"not named in its folder's {MANIFEST} (not written by the save that wrote the folder)"
    if file_digest(path) != digests[path.name]:
        return f"its {ALGORITHM} digest differs from the one {MANIFEST} recorded when it was written (changed since)"
    return ""
