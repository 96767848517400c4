"""The fork server where it cannot be: no socket in a temporary folder too deep for one, so nothing starts
(the server at work, with real processes: tests/processes/cluster/test_forkserver.py)."""

from __future__ import annotations

import tempfile

from shoal.cluster.node import forkserver
from tests.support import forked

MODULE = forked.__name__


def test_no_server_where_the_temporary_folder_is_too_deep_for_a_socket(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert forkserver.start(MODULE) is None
    with forkserver.serving(MODULE) as server:
        assert server is None
    assert list(deep.iterdir()) == []
