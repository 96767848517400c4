"""The emulated hosts themselves: each has its own /tmp, yet a checkout under /tmp (its code and its .venv)
still runs on every host, as `make test` from such a checkout needs."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.cluster.hosts import (
    CHECKOUT,
    EmulatedCluster,
    HostCommandFailed,
    code_folders,
    missing_requirements,
    under_tmp,
)


def test_only_the_outermost_folders_under_tmp_are_kept(tmp_path):
    inner = tmp_path / "checkout" / ".venv"
    inner.mkdir(parents=True)
    assert under_tmp([inner, tmp_path / "checkout", "/tmp", "/usr", tmp_path / "absent"]) == \
        ([(tmp_path / "checkout").resolve()] if tmp_path.resolve().is_relative_to("/tmp") else [])
    assert CHECKOUT in code_folders() and (CHECKOUT / "tests" / "cluster" / "hosts.py").exists()


@pytest.fixture
def checkout():
    """A folder under the machine's /tmp holding a program, as a checkout cloned there holds .venv/bin/python."""
    folder = Path(tempfile.mkdtemp(prefix="shoal-checkout-", dir="/tmp"))
    program = folder / ".venv" / "bin" / "python"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\necho ran from the checkout\n")
    program.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(60)
def test_a_host_runs_a_checkout_under_tmp_yet_keeps_its_own_tmp(checkout, project_env):
    reason = missing_requirements(1)
    if reason:
        pytest.skip(reason)
    hidden = Path(tempfile.mkdtemp(prefix="shoal-not-kept-", dir="/tmp"))
    try:
        with EmulatedCluster(hosts=1, keep=[*code_folders(), checkout]) as cluster:
            assert cluster.run(0, [str(checkout / ".venv" / "bin" / "python")]) == "ran from the checkout\n"
            # the project's own Python and code, wherever they were checked out
            assert cluster.run(0, [sys.executable, "-c", "import shoal, tests.cluster.hosts; print('imported')"],
                               env=project_env) == "imported\n"
            with pytest.raises(HostCommandFailed):  # the rest of the machine's /tmp stays out of sight
                cluster.run(0, ["test", "-e", str(hidden)])
            cluster.run(0, ["touch", "/tmp/written-on-the-host"])
            assert (cluster.private(0) / "written-on-the-host").exists()
            assert not Path("/tmp/written-on-the-host").exists()
    finally:
        shutil.rmtree(hidden, ignore_errors=True)
