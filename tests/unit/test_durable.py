"""Durable writes: a full disk told apart from other failures, and no temporary left by a failed write."""

from __future__ import annotations

import errno
import os

import pytest

from shoal.durable import disk_full, write_durably


def raised_while_handling(error: BaseException) -> RuntimeError:
    """An error raised while `error` was being handled, as torch raises its own over a file's OSError."""
    try:
        try:
            raise error
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize("error, full", [
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), True),
    (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), True),
    (OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"), True),  # pyarrow's
    (raised_while_handling(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))), True),  # torch's
    (raised_while_handling(OSError(errno.EIO, os.strerror(errno.EIO))), False),
    (OSError(errno.EACCES, os.strerror(errno.EACCES)), False),
    (RuntimeError("something else"), False),
])
def test_a_full_disk_is_told_apart(error, full):
    assert disk_full(error) is full


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "kept.json"
    path.write_text("old")

    def fill(handle):
        handle.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OSError):
        write_durably(path, fill)
    assert os.listdir(tmp_path) == ["kept.json"] and path.read_text() == "old"
    write_durably(path, lambda handle: handle.write(b"new"))
    assert os.listdir(tmp_path) == ["kept.json"] and path.read_text() == "new"
