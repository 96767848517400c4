"""The reference pages, written from the code so that they cannot drift from it.

`reference/job-file.md` lists every job-file key from the dataclasses `shoal.config` builds a job
from (and each algorithm's `Options`), with its type, its default and the string literal written
after the field (Python keeps no attribute docstrings at runtime, so they are read with `ast`).
`reference/cli.md` walks the argparse parser of `shoal.cli`. The MkDocs hook calls
`write_references` before every build; `python docs/generate.py docs` does the same by hand.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import re
import sys
import types
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if (ROOT / "src" / "shoal").is_dir() and str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))  # this checkout's code, not an installed copy's

NO_DESCRIPTION = "(no description)"
FLATTENED = ("algorithm", "options")
"""jobs.from_dict reads the keys of [algorithm] other than name as the named algorithm's options: the
`options` field is never written in a job file, each algorithm's option keys are."""
DEFAULTS_ELSEWHERE = {"name": "the job file's name, without `.toml`"}
"""Defaults the job file gets from elsewhere than its dataclass: jobs.load_job names a job after its file
(the dataclass's "job" is for a job made from a dict); the unit test checks that this still holds."""
USAGE_WIDTH = 100
"""Usage lines wrap here whatever the terminal that builds the site (argparse reads COLUMNS)."""
TYPE_NAMES = {int: ("integer", "integers"), float: ("number", "numbers"), str: ("string", "strings"),
              bool: ("boolean", "booleans"), dict: ("table", "tables"), typing.Any: ("any value", "values")}


def write_references(docs_dir: Path) -> None:
    """Write docs_dir/reference/job-file.md and cli.md; a page whose text is unchanged is left untouched,
    so that `mkdocs serve`, which rebuilds when a file under docs changes, does not rebuild forever."""
    folder = Path(docs_dir) / "reference"
    folder.mkdir(exist_ok=True)
    for name, text in (("job-file.md", job_file_page()), ("cli.md", cli_page())):
        path = folder / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


# Markdown ------------------------------------------------------------------------------------------------------


def escape(text: str) -> str:
    """Prose for a table cell: one line; outside code spans, characters that Markdown (and attr_list, and
    raw HTML) would read as markup are escaped, so a docstring renders as written."""
    pieces = re.split(r"(`[^`\n]+`)", " ".join(text.split()))
    return "".join(piece if index % 2 else _escape_prose(piece) for index, piece in enumerate(pieces))


def _escape_prose(text: str) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_{}\[\]|])", r"\\\1", text)


def code(text: str) -> str:
    """A code span that holds any text, backticks included."""
    text = " ".join(str(text).split())
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    padding = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


# The job file --------------------------------------------------------------------------------------------------


@functools.cache
def field_docstrings(cls: type) -> dict[str, str]:
    """Each field's docstring: the string literal right after it in the class body (base classes too)."""
    found: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            found.update(_class_body_docstrings(base))
    return found


def _class_body_docstrings(cls: type) -> dict[str, str]:
    tree = ast.parse(Path(inspect.getsourcefile(cls)).read_text(encoding="utf-8"))
    node = _class_node(tree, cls.__qualname__.split("."))
    found = {}
    for statement, following in zip(node.body, node.body[1:]):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            found[statement.target.id] = inspect.cleandoc(following.value.value)
    return found


def _class_node(tree: ast.AST, path: list[str]) -> ast.ClassDef:
    body = tree.body
    for name in path:
        node = next(item for item in body if isinstance(item, ast.ClassDef) and item.name == name)
        body = node.body
    return node


def class_docstring(cls: type) -> str | None:
    """The docstring written in the class (the one dataclass makes up from the signature is not)."""
    tree = ast.parse(Path(inspect.getsourcefile(cls)).read_text(encoding="utf-8"))
    return ast.get_docstring(_class_node(tree, cls.__qualname__.split(".")))


def type_name(annotation: typing.Any, plural: bool = False) -> str:
    """A field's type in the job file's words (TOML's); None is left out: a default of None says "unset"."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        arms = [arm for arm in typing.get_args(annotation) if arm is not type(None)]
        return " or ".join(type_name(arm, plural) for arm in arms)
    if origin is list or annotation is list:
        (item,) = typing.get_args(annotation) or (typing.Any,)
        return "arrays of " + type_name(item, True) if plural else "array of " + type_name(item, True)
    if origin is dict or dataclasses.is_dataclass(annotation):
        annotation = dict
    if annotation in TYPE_NAMES:
        return TYPE_NAMES[annotation][plural]
    return str(annotation).replace("typing.", "")


def toml_value(value: typing.Any) -> str:
    """A default as it would be written in the job file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string escapes as JSON does
    if dataclasses.is_dataclass(value):  # a nested table's default: its keys' defaults
        value = dataclasses.asdict(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{key} = {toml_value(item)}" for key, item in value.items())
        return "{ " + inner + " }" if inner else "{}"
    return repr(value)


def default_cell(field: dataclasses.Field, key: str, required: set[str]) -> str:
    if key in DEFAULTS_ELSEWHERE:
        return escape(DEFAULTS_ELSEWHERE[key])
    if field.name in required or (field.default is dataclasses.MISSING
                                  and field.default_factory is dataclasses.MISSING):
        return "*required*"
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    return "unset" if value is None else code(toml_value(value))


def defaults_refused(cls: type, prefix: str) -> tuple[set[str], str | None]:
    """What the class says of a table that gives no key: the fields it requires (`data.train: required`), and
    any other rule it states (`model: give exactly one of ...`)."""
    from shoal.errors import ConfigError

    try:
        cls()
    except ConfigError as error:
        key, _, rest = str(error).partition(": ")
        if key.startswith(prefix) and rest.startswith("required"):
            return {key[len(prefix):]}, None
        return set(), rest or str(error)
    except TypeError:  # a field without a default: shown as required already
        pass
    return set(), None


def key_rows(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """One row per key of `cls` in declaration order; a field that is itself a dataclass is a nested
    table, its keys listed after it."""
    docstrings, hints = field_docstrings(cls), typing.get_type_hints(cls)
    required, _ = defaults_refused(cls, prefix)
    rows = []
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        description = docstrings.get(field.name, NO_DESCRIPTION)
        rows.append((code(prefix + field.name), type_name(hints[field.name]),
                     default_cell(field, prefix + field.name, required),
                     escape(description)))
        if dataclasses.is_dataclass(hints[field.name]):
            rows += key_rows(hints[field.name], f"{prefix}{field.name}.")
    return rows


KEY_HEADER = ("Key", "Type", "Default", "Description")


def section_lines(name: str, cls: type, required: bool) -> list[str]:
    lines = [f"## {code(f'[{name}]')}", ""]
    if required:
        lines += ["A required table.", ""]
    if class_docstring(cls):
        lines += [escape(class_docstring(cls)), ""]
    _, rule = defaults_refused(cls, f"{name}.")
    if rule:
        lines += [f"**Rule:** {escape(rule)}.", ""]
    skip = (FLATTENED[1],) if name == FLATTENED[0] else ()
    return lines + table(KEY_HEADER, key_rows(cls, f"{name}.", skip))


def algorithm_lines() -> list[str]:
    """Each algorithm's own keys, written in [algorithm] beside `name`."""
    from shoal.algorithms import REGISTRY, catalogue, refused_elsewhere
    from shoal.config import AlgorithmConfig

    options_doc = field_docstrings(AlgorithmConfig).get(FLATTENED[1], NO_DESCRIPTION)
    lines = [f"{escape(options_doc)} They are written in {code('[algorithm]')} itself, beside {code('name')}, "
             "and listed below for each algorithm. A key of another algorithm is set aside (so "
             f"{code('--set algorithm.name=sync')} works on a job written for another algorithm), and a key "
             "no algorithm knows is an error.", ""]
    for key, reason in refused_elsewhere().items():
        lines += [f"Refused by the algorithms that lack it: {code(key)} ({escape(reason)}).", ""]
    summaries = catalogue()
    for name, classes in REGISTRY.items():
        lines += [f"### {code(f'algorithm.name = {json.dumps(name)}')}", ""]
        for entry, variant, summary in summaries:
            if entry == name:
                lines += [(f"With {code(variant)}: " if variant else "") + escape(summary) + ".", ""]
        rows = key_rows(classes[0].Options, "algorithm.")
        lines += table(KEY_HEADER, rows) if rows else ["No keys of its own.", ""]
    return lines


def job_file_page() -> str:
    from shoal.config import JobConfig, section_fields

    sections = section_fields()
    lines = ["# Job file reference", "",
             "A job file is TOML: a few top-level keys, then one table per section. Every key is checked before "
             "any process starts, and any key can be overridden from the command line with "
             f"{code('--set section.key=value')}, the value written as in TOML. This page is generated from "
             "the code (`docs/generate.py`), so it lists exactly the keys shoal reads.", "",
             "## Top-level keys", ""]
    lines += table(KEY_HEADER, key_rows(JobConfig, "", skip=tuple(sections)))
    for field in dataclasses.fields(JobConfig):
        if field.name in sections:
            required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
            lines += section_lines(field.name, sections[field.name], required)
            if field.name == FLATTENED[0]:
                lines += algorithm_lines()
    return "\n".join(lines).rstrip() + "\n"


def undocumented_keys() -> list[str]:
    """The job-file keys whose field has no docstring, as their tables would show them (dotted)."""
    from shoal.algorithms import REGISTRY
    from shoal.config import JobConfig, section_fields

    tables = [(JobConfig, "")] + [(cls, f"{name}.") for name, cls in section_fields().items()]
    tables += [(classes[0].Options, "algorithm.") for classes in REGISTRY.values()]
    found = set()
    for cls, prefix in tables:
        described = field_docstrings(cls)
        for field in dataclasses.fields(cls):
            if field.name not in described and not dataclasses.is_dataclass(typing.get_type_hints(cls)[field.name]):
                found.add(prefix + field.name)
    return sorted(found)


# The command line ----------------------------------------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str | None, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the order they were added."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            found += [(name, helps.get(name), sub) for name, sub in action.choices.items()]
    return found


def usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def value_text(action: argparse.Action) -> str:
    """What follows the option, as the usage line writes it (argparse's own rules)."""
    if action.nargs == 0:
        return ""
    formatter = argparse.HelpFormatter(action.dest)
    metavar = (formatter._get_default_metavar_for_optional(action) if action.option_strings
               else formatter._get_default_metavar_for_positional(action))
    return formatter._format_args(action, metavar)


def help_text(action: argparse.Action, prog: str) -> str:
    """The help as `--help` prints it: %(default)s, %(choices)s and the like filled in."""
    if not action.help:
        return NO_DESCRIPTION
    params = {key: value for key, value in vars(action).items() if value is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(choice) for choice in params["choices"])
    return action.help % params


def cli_default(action: argparse.Action) -> str:
    if action.required:
        return "*required*"
    unset = action.default is None or action.default is False or action.default is argparse.SUPPRESS
    shown = [] if unset or action.default == [] else [code(action.default)]
    if action.nargs == "?" and action.option_strings and action.const is not None:
        shown.append(f"given alone: {code(action.const)}")
    elif action.nargs == "?":
        shown.insert(0, "optional")
    return "; ".join(shown) or "—"


def argument_rows(actions: list[argparse.Action], prog: str) -> list[tuple[str, ...]]:
    """One row per argument `--help` shows (not -h itself, nor the subcommands: they have sections)."""
    rows = []
    for action in actions:
        if action.help == argparse.SUPPRESS or isinstance(action, (argparse._HelpAction,
                                                                    argparse._SubParsersAction)):
            continue
        name = ", ".join(code(option) for option in action.option_strings) or code(action.metavar or action.dest)
        value = value_text(action) if action.option_strings or action.choices else ""
        if action.nargs == "?" and value:
            value = value[1:-1]  # argparse's brackets: the Default column says it is optional
        rows.append((name, code(value) if value else "—", cli_default(action), escape(help_text(action, prog))))
    return rows


ARGUMENT_HEADER = ("Argument", "Value", "Default", "Description")


def command_lines(parser: argparse.ArgumentParser, summary: str | None, depth: int) -> list[str]:
    lines = [f"{'#' * depth} {code(parser.prog)}", ""]
    if summary:  # the one-line help of add_parser, a phrase
        lines += [escape(summary[0].upper() + summary[1:]) + ("" if summary.endswith(".") else "."), ""]
    if parser.description:
        lines += [escape(parser.description), ""]
    lines += ["```text", usage(parser), "```", ""]
    for group in parser._action_groups:
        rows = argument_rows(group._group_actions, parser.prog)
        if rows:
            lines += [f"**{escape(group.title[0].upper() + group.title[1:])}**", ""] + table(ARGUMENT_HEADER, rows)
    children = subcommands(parser)
    if children:
        lines += table(("Command", "Description"), [(code(sub.prog), escape(text or NO_DESCRIPTION))
                                                    for _, text, sub in children])
    for _, text, sub in children:
        lines += command_lines(sub, text, min(depth + 1, 4))
    return lines


def cli_page() -> str:
    from shoal.cli import parser

    lines = ["# Command-line reference", "",
             "Every `shoal` command and its options, generated from the command's own parser "
             "(`docs/generate.py`): `shoal COMMAND --help` prints the same. Every command also takes "
             f"{code('-h')}, {code('--help')}.", ""]
    return "\n".join(lines + command_lines(parser(), None, 2)).rstrip() + "\n"


def undocumented_options() -> list[str]:
    """Arguments of the `shoal` parser without a help text, as "shoal data synth --rows"."""
    from shoal.cli import parser

    found, pending = [], [parser()]
    while pending:
        command = pending.pop(0)
        for action in command._actions:
            if action.help is None and not isinstance(action, argparse._SubParsersAction):
                found.append(f"{command.prog} {(action.option_strings or [action.dest])[-1]}")
        pending += [sub for _, _, sub in subcommands(command)]
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    arguments = argparse.ArgumentParser(prog="generate.py", description=__doc__.splitlines()[0])
    arguments.add_argument("docs_dir", type=Path, help="the MkDocs docs folder (reference/ is written in it)")
    docs_dir = arguments.parse_args(argv).docs_dir
    if not docs_dir.is_dir():
        print(f"generate.py: error: {docs_dir}: no such folder", file=sys.stderr)
        return 2
    write_references(docs_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
