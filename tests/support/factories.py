"""A user's own factory module, written into the current folder (not on sys.path), for the tests of trusting
code in run directories: tests/unit/test_trust.py and tests/processes/test_trust.py share it (fixture `factories`
in tests/conftest.py)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

FACTORIES = "shoal_trust_factories"

SOURCE = textwrap.dedent("""
    from torch import nn

    def mlp(features, classes=2):
        return nn.Sequential(nn.Linear(features, classes))

    def broken(features):
        raise ValueError("no width fits\\nthe second line stays out")

    def mistyped(features):
        return nn.Linear(features, "two")
""")


def user_factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The module's name, with the current folder holding it; it is forgotten after."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / f"{FACTORIES}.py").write_text(SOURCE)
    monkeypatch.chdir(folder)
    monkeypatch.delitem(sys.modules, FACTORIES, raising=False)
    yield FACTORIES
    sys.modules.pop(FACTORIES, None)
