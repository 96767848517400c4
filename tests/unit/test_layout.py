"""The shape of the source tree: no import cycles, layers that import only downward, short functions.

Read from the source with `ast` (imports inside functions count too), so a change that would
tangle the modules fails here in a second instead of in a reviewer's head.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SOURCE / "shoal"

# What each layer may not import (a prefix match on module names), lowest layer first.
FORBIDDEN = {
    "shoal.errors": ("shoal.",),
    "shoal.events": ("shoal.config", "shoal.algorithms", "shoal.train", "shoal.cluster", "shoal.data", "shoal.api",
                     "shoal.cli", "shoal.jobs", "shoal.worker", "shoal.bench"),
    "shoal.config": ("shoal.algorithms", "shoal.train", "shoal.cluster", "shoal.data", "shoal.api", "shoal.jobs"),
    "shoal.cluster": ("shoal.algorithms", "shoal.train", "shoal.api", "shoal.cli", "shoal.jobs", "shoal.worker"),
    "shoal.data": ("shoal.algorithms", "shoal.train", "shoal.cluster", "shoal.api", "shoal.cli", "shoal.worker"),
    "shoal.algorithms": ("shoal.train", "shoal.api", "shoal.cli", "shoal.jobs", "shoal.worker", "shoal.bench"),
    # the run directory and its readers sit below training, which saves its model.pt: status reads no loop
    "shoal.run": ("shoal.cluster", "shoal.algorithms", "shoal.train", "shoal.inference", "shoal.api", "shoal.cli",
                  "shoal.jobs", "shoal.worker", "shoal.bench", "shoal.plan"),
    "shoal.train": ("shoal.inference", "shoal.api", "shoal.cli", "shoal.worker", "shoal.bench", "shoal.plan"),
    # a trained model put to use, above training (the loss reads its outputs): no job, no algorithm
    "shoal.inference": ("shoal.algorithms", "shoal.api", "shoal.cli", "shoal.jobs", "shoal.worker", "shoal.bench",
                        "shoal.plan"),
    "shoal.worker": ("shoal.inference", "shoal.api", "shoal.cli", "shoal.bench", "shoal.plan"),
    "shoal.plan": ("shoal.inference", "shoal.api", "shoal.cli", "shoal.worker", "shoal.jobs"),
}
for lower in ("shoal.events", "shoal.config", "shoal.cluster", "shoal.data", "shoal.algorithms"):
    FORBIDDEN[lower] += ("shoal.plan",)  # the planner sits beside bench, above training
    FORBIDDEN[lower] += ("shoal.run", "shoal.inference")  # a run's files and their use come after these
SHORT_FUNCTION_PACKAGES = ("train", "run", "inference", "algorithms", "cluster", "plan")
LONGEST_FUNCTION = 60


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path) -> set[str]:
    """shoal modules that `name` imports anywhere in its file (a package's name when a name is not a module)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
    return {module for module in found if module in MODULES and module != name}


GRAPH = {name: imported(name, path) for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return result


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_src_counting_imports_inside_functions():
    assert cycles(GRAPH) == []


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_import_only_downward(layer):
    offending = {
        f"{name} imports {target}"
        for name, targets in GRAPH.items() if name == layer or name.startswith(layer + ".")
        for target in targets if any(target == banned or target.startswith(banned) for banned in FORBIDDEN[layer])
    }
    assert not offending


def test_no_function_in_train_algorithms_or_cluster_is_over_60_lines():
    long = []
    for package in SHORT_FUNCTION_PACKAGES:
        for path in sorted((PACKAGE / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = node.end_lineno - node.lineno + 1
                    if length > LONGEST_FUNCTION:
                        long.append(f"{path.relative_to(SOURCE)}:{node.lineno} {node.name} ({length} lines)")
    assert not long


def test_every_module_says_why_it_exists():
    silent = [name for name, path in MODULES.items() if not ast.get_docstring(ast.parse(path.read_text()))]
    assert not silent


@pytest.mark.parametrize("page", ["README.md", "docs/algorithms.md"])
def test_the_readme_lists_exactly_the_registered_algorithms(page):
    from shoal.algorithms import catalogue

    text = (SOURCE.parent / page).read_text()  # the table follows the "Algorithms" heading (# or ##)
    table = re.split(r"^#{1,2} Algorithms$", text, maxsplit=1, flags=re.M)[1].split("\n\n", 2)[1]
    listed = {row.split("|")[1].strip() for row in table.splitlines()[2:]}
    registered = {f"`{name}`" + (f", `{variant}`" if variant else "") for name, variant, _ in catalogue()}
    assert listed == registered


def test_collective_algorithms_have_no_server_hooks():
    from shoal.algorithms import CollectiveAlgorithm, ServerAlgorithm

    server_only = ("plan", "serve_epoch", "trainer_ranks", "role", "links", "on_update", "step")
    assert not [hook for hook in server_only if hasattr(CollectiveAlgorithm, hook)]
    assert all(hasattr(ServerAlgorithm, hook) for hook in ("plan", "serve_epoch", "trainer_ranks", "role"))


EVENT_READERS = sorted([*(path for path in PACKAGE.rglob("*.py") if path != PACKAGE / "events.py"),
                        *(SOURCE.parent / "benchmarks").glob("*.py")])


def test_event_kinds_are_named_only_in_the_events_module():
    from shoal.events import KINDS

    named = [f"{path.relative_to(SOURCE.parent)}:{node.lineno} {node.value!r}"
             for path in EVENT_READERS for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and node.value in KINDS]
    assert not named


def test_runs_are_read_as_typed_events():
    """`read_events` gives the records as stored (for tests of the format); shoal itself reads a History."""
    raw = [str(path.relative_to(SOURCE.parent)) for path in EVENT_READERS
           if "read_events" in imported_names(path)]
    assert not raw


def imported_names(path: Path) -> set[str]:
    return {alias.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) for alias in node.names}
