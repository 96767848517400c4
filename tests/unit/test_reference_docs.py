"""The generated reference pages hold every job-file key with its default and every command with its options.

docs/generate.py writes them from the code for each MkDocs build; these tests read what it wrote, and
hold the list of keys still without a description, so that a new field documents itself or fails here.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from shoal.algorithms import REGISTRY
from shoal.cli import parser as shoal_parser
from shoal.config import JobConfig, section_fields
from shoal.jobs import load_job

GENERATOR = Path(__file__).resolve().parents[2] / "docs" / "generate.py"
KNOWN_UNDOCUMENTED_KEYS: set[str] = set()
"""Job-file keys whose field has no docstring today: none. A new one fails the test: document it."""
KNOWN_UNDOCUMENTED_OPTIONS = {"shoal data synth --rows"}
"""Command-line arguments without a help text today."""
REQUIRED_KEYS = {"data.train"}
"""Keys whose dataclass default is refused (`data.train: required`): the page says required."""


def load_generator():
    spec = importlib.util.spec_from_file_location("shoal_docs_generate", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generator():
    return load_generator()


@pytest.fixture(scope="module")
def pages(generator, tmp_path_factory) -> dict[str, str]:
    docs = tmp_path_factory.mktemp("docs")
    generator.write_references(docs)
    return {name: (docs / "reference" / name).read_text() for name in ("job-file.md", "cli.md")}


def row(page: str, key: str) -> list[str]:
    """The cells of the table row whose first cell is `key` (the only one)."""
    found = [line for line in page.splitlines() if line.startswith(f"| `{key}` |")]
    assert len(found) == 1, f"{key}: {len(found)} rows"
    return split_row(found[0])


def split_row(line: str) -> list[str]:
    """A table row's cells, split where Python-Markdown splits them: not at an escaped pipe, nor in code."""
    cells, cell, in_code, escaped = [], "", False, False
    for character in line.strip()[1:-1]:
        if character == "|" and not in_code and not escaped:
            cells.append(cell.strip())
            cell = ""
            continue
        in_code ^= character == "`" and not escaped
        escaped = character == "\\" and not escaped
        cell += character
    return cells + [cell.strip()]


def section(page: str, heading: str) -> str:
    """The text under `heading` down to the next heading of any level."""
    found = re.search(rf"^{re.escape(heading)}$", page, re.MULTILINE)
    assert found, heading
    return page[found.end():].split("\n#", 1)[0]


def parsed_default(cell: str):
    """A default cell read back as TOML: `unset` is None, a code span its value."""
    if cell == "unset":
        return None
    assert cell.startswith("`") and cell.endswith("`"), cell
    return tomllib.loads(f"value = {cell.strip('`')}")["value"]


def default_of(field: dataclasses.Field):
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


def check_keys(page: str, cls: type, prefix: str, skip: tuple[str, ...] = ()) -> None:
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        cells = row(page, prefix + field.name)
        if prefix + field.name in REQUIRED_KEYS:
            assert cells[2] == "*required*"
        else:
            assert parsed_default(cells[2]) == default_of(field), prefix + field.name


def test_every_key_of_every_section_appears_with_its_default(pages):
    page = pages["job-file.md"]
    for name, cls in section_fields().items():
        assert f"## `[{name}]`" in page
        check_keys(page, cls, f"{name}.", skip=("options",) if name == "algorithm" else ())
    assert row(page, "name")[2] == "the job file's name, without `.toml`"
    assert "`algorithm.options`" not in page  # its keys are written flat in [algorithm]


def test_sections_and_keys_come_in_the_order_the_dataclasses_declare(pages):
    page = pages["job-file.md"]
    headings = [page.index(f"## `[{name}]`") for name in section_fields()]
    assert headings == sorted(headings)
    keys = [page.index(f"| `train.{field.name}` |") for field in dataclasses.fields(section_fields()["train"])]
    assert keys == sorted(keys)


def test_every_algorithm_has_its_options_under_its_own_heading(pages):
    page = pages["job-file.md"]
    for name, classes in REGISTRY.items():
        text = section(page, f'### `algorithm.name = "{name}"`')
        check_keys(text, classes[0].Options, "algorithm.")
        assert classes[0].summary() in text
    averaging = section(page, '### `algorithm.name = "averaging"`')
    assert parsed_default(row(averaging, "algorithm.period")[2]) == "epoch"


def test_a_key_the_job_file_names_after_its_file_is_documented_so(tmp_path):
    path = tmp_path / "digits.toml"
    path.write_text('[model]\nlayers = [{ dense = 2 }]\n[data]\ntrain = "somewhere"\n')
    assert load_job(path).name == "digits"
    assert dataclasses.fields(JobConfig)[-1].name == "name"


def walk(command: argparse.ArgumentParser):
    """Every parser under `command`, itself first."""
    yield command
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from walk(sub)


def test_every_subcommand_appears_with_each_of_its_options(pages):
    page = pages["cli.md"]
    commands = list(walk(shoal_parser()))
    assert {"shoal train", "shoal data import", "shoal bench report", "shoal plan"} <= {c.prog for c in commands}
    for command in commands:
        depth = "#" * min(command.prog.count(" ") + 2, 4)
        text = section(page, f"{depth} `{command.prog}`")
        for action in command._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.metavar or action.dest}`"
            if action.help == argparse.SUPPRESS:
                assert f"| {names} |" not in text
            else:
                assert f"| {names} |" in text, f"{command.prog} {names}"


def test_an_option_shows_its_value_and_default(pages):
    page = pages["cli.md"]
    train = section(page, "### `shoal train`")
    assert row(train, "--workers")[1] == "`N|auto`"
    assert row(train, "--max-restarts")[2] == "`0`"
    importer = section(page, "#### `shoal data import`")
    assert row(importer, "--format")[2] == "*required*"
    assert "csv, libsvm" in row(importer, "--format")[3]  # %(choices)s filled in
    assert row(section(page, "### `shoal status`"), "--watch")[2] == "given alone: `2.0`"


class Renderer(HTMLParser):
    """The tags of rendered HTML, and the text of each table cell."""

    def __init__(self):
        super().__init__()
        self.tags, self.cells, self.cell = set(), [], None

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "td":
            self.cell = []

    def handle_endtag(self, tag):
        if tag == "td":
            self.cells.append("".join(self.cell))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def rendered(page: str) -> Renderer:
    markdown = pytest.importorskip("markdown")
    renderer = Renderer()
    renderer.feed(markdown.markdown(page, extensions=["tables", "attr_list", "toc", "fenced_code"]))
    return renderer


@pytest.mark.parametrize("name", ["job-file.md", "cli.md"])
def test_the_pages_render_as_plain_markdown_without_html_or_links(pages, name):
    tags = rendered(pages[name]).tags
    assert tags <= {"h1", "h2", "h3", "h4", "p", "table", "thead", "tbody", "tr", "th", "td", "code", "pre",
                    "strong", "em"}, tags


def test_every_description_renders_as_its_docstring_says(pages, generator):
    cells = set(rendered(pages["job-file.md"]).cells)
    classes = [*section_fields().values(), JobConfig, *(classes[0].Options for classes in REGISTRY.values())]
    for cls in classes:
        for key, text in generator.field_docstrings(cls).items():
            if key not in section_fields() and key != "options":
                assert " ".join(text.replace("`", "").split()) in cells, key


def test_no_new_job_file_key_lacks_a_description(generator):
    undocumented = set(generator.undocumented_keys())
    print("job-file keys without a description:", sorted(undocumented) or "none")
    assert undocumented <= KNOWN_UNDOCUMENTED_KEYS, f"document: {sorted(undocumented - KNOWN_UNDOCUMENTED_KEYS)}"


def test_no_new_command_line_argument_lacks_a_help_text(generator):
    undocumented = set(generator.undocumented_options())
    print("arguments without a help text:", sorted(undocumented))
    assert undocumented <= KNOWN_UNDOCUMENTED_OPTIONS, sorted(undocumented - KNOWN_UNDOCUMENTED_OPTIONS)


@dataclasses.dataclass
class UndocumentedOptions:
    documented: int = 1
    """Has its description."""
    forgotten: str = "x"


class Undocumented:
    Options = UndocumentedOptions


def test_a_new_field_without_a_docstring_is_caught_and_shown_so(generator, monkeypatch):
    monkeypatch.setitem(REGISTRY, "undocumented", (Undocumented,))
    assert "algorithm.forgotten" in generator.undocumented_keys()
    assert "algorithm.documented" not in generator.undocumented_keys()
    rows = generator.key_rows(UndocumentedOptions, "algorithm.")
    assert rows[1] == ("`algorithm.forgotten`", "string", '`"x"`', "(no description)")


def test_an_unchanged_page_is_not_written_again(generator, tmp_path):
    generator.write_references(tmp_path)
    page = tmp_path / "reference" / "cli.md"
    os.utime(page, ns=(1, 1))  # a build that rewrote it would move the time (mkdocs serve rebuilds then)
    generator.write_references(tmp_path)
    assert page.stat().st_mtime_ns == 1


def test_a_missing_docs_folder_is_one_line_naming_it(generator, tmp_path, capsys):
    assert generator.main([str(tmp_path / "nowhere")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "nowhere: no such folder" in error
