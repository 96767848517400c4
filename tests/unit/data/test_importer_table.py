"""The importers' table is the one list of import formats: the CLI offers its keys, each entry loads.

What importing it leaves unimported is checked in fresh interpreters: tests/processes/data/test_importer_table.py.
"""

from __future__ import annotations

import argparse

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

