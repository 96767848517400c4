"""The small trained run that several command-line test modules read and never change, trained once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.jobs import train_small


@pytest.fixture(scope="session")
def small_run(tmp_path_factory) -> tuple[Path, Path]:
    """(run directory, test set) of tests.e2e.jobs.train_small: export and predict read it; none writes into it."""
    return train_small(tmp_path_factory.mktemp("small"))
