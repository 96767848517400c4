"""The importers' table is the one list of import formats: the CLI offers its keys, each entry loads.

Importing the package must not import h5py: only an HDF5 import needs it, and it is slow to load.
Building the CLI's parser must not import the importers at all, so that `shoal --help` stays fast.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from shoal.cli import parser
from shoal.data.importers import FORMATS, IMPORTERS, TABLE_FORMATS


def subparser(root: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (commands,) = [action for action in root._actions if isinstance(action, argparse._SubParsersAction)]
    return commands.choices[name]


def test_the_cli_offers_exactly_the_table_formats():
    command = subparser(subparser(parser(), "data"), "import")
    (option,) = [action for action in command._actions if "--format" in action.option_strings]
    assert list(option.choices) == list(IMPORTERS)
    assert all(name in option.choices for name in IMPORTERS) and "xlsx" not in option.choices
    assert "the source's format: " + ", ".join(IMPORTERS) in " ".join(command.format_help().split())


def test_formats_and_table_formats_come_from_the_table():
    assert FORMATS == tuple(IMPORTERS)
    assert TABLE_FORMATS == ("csv", "parquet")


@pytest.mark.parametrize("name", sorted(IMPORTERS))
def test_every_table_entry_is_importable(name):
    assert callable(IMPORTERS[name].load())


def child_prints_false(check: str, project_env: dict) -> None:
    result = subprocess.run([sys.executable, "-c", check], env=project_env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_importing_the_importers_does_not_import_h5py(project_env):
    child_prints_false("import sys, shoal.data.importers; print('h5py' in sys.modules)", project_env)


def test_building_the_parser_does_not_import_the_importers(project_env):
    child_prints_false("import sys, shoal.cli; shoal.cli.parser(); print('shoal.data.importers' in sys.modules)",
                       project_env)
