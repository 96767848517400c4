"""The README and the docs site point only at what exists, and their job files are jobs shoal reads.

`mkdocs build --strict` (make docs, make test) fails on a broken link inside the site; this test also
holds the README, which the site does not build, reads no network and starts no process, so `make
check` catches a moved page or a renamed heading in a second.
"""

from __future__ import annotations

import re
import tomllib
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GENERATED = {DOCS / "reference" / "job-file.md", DOCS / "reference" / "cli.md"}
"""Written by docs/generate.py at every build (docs/hooks.py), so absent from a fresh checkout."""
SOURCES = sorted({ROOT / "README.md", *DOCS.rglob("*.md")} - GENERATED)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)
README_LINES = 200
IMAGE_BYTES = 100_000


def prose(text: str) -> str:
    """The text without code blocks or code spans, where brackets are code, not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc (MkDocs) makes it."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    return {slug(CODE_SPAN.sub(lambda span: span.group()[1:-1], title))
            for title in HEADING.findall(FENCE.sub("", page.read_text()))}


def relative_links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def broken(page: Path, docs: Path = DOCS) -> list[str]:
    found = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if path and page.parent.is_relative_to(docs) and not resolved.is_relative_to(docs):
            found.append(f"{target}: outside docs/, which the site cannot serve")
        elif path and not resolved.is_file() and resolved not in GENERATED:
            found.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and resolved not in GENERATED and anchor not in anchors(resolved):
            found.append(f"{target}: no heading with that anchor")
    return found


@pytest.mark.parametrize("page", SOURCES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_points_at_an_existing_file_and_heading(page):
    assert not broken(page)


def test_the_link_check_sees_a_broken_link_an_anchor_and_a_way_out(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A page\n\n## Two words\n")
    (tmp_path / "x.md").write_text("outside")
    page = docs / "b.md"
    page.write_text("[ok](a.md#two-words) [gone](c.md) [anchor](a.md#three) [out](../x.md) `[code](z.md)`\n")
    assert broken(page, docs=docs) == ["c.md: no such file", "a.md#three: no heading with that anchor",
                                       "../x.md: outside docs/, which the site cannot serve"]


def test_the_readme_is_at_most_200_lines_and_links_into_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_LINES
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in relative_links(ROOT / "README.md")}
    assert {DOCS / "getting-started.md", DOCS / "algorithms.md", DOCS / "internals" / "design.md"} <= linked


def test_pictures_stay_small():
    assert [path.name for path in (DOCS / "images").iterdir() if path.stat().st_size >= IMAGE_BYTES] == []


def toml_blocks(page: Path) -> list[str]:
    return re.findall(r"^```toml\n(.*?)^```", page.read_text(), re.S | re.M)


JOB_PAGES = [ROOT / "README.md", DOCS / "getting-started.md", DOCS / "job-files.md"]


@pytest.mark.parametrize("page", JOB_PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_job_file_shown_is_one_shoal_reads(page):
    from shoal.jobs import from_dict

    blocks = toml_blocks(page)
    assert blocks
    for block in blocks:
        from_dict(tomllib.loads(block))


def test_the_readme_and_getting_started_show_the_same_first_job():
    readme, guide = (toml_blocks(ROOT / name) for name in ("README.md", "docs/getting-started.md"))
    assert readme[0] == guide[0]


DESIGN = DOCS / "internals" / "design.md"
MODULES = sorted((ROOT / "src").rglob("*.py"))


def named_files(text: str) -> set[str]:
    return set(re.findall(r"[\w/]+\.py\b", text))


def exists(name: str) -> bool:
    """A file the design names: from the project's root, or the tail of a module's path under src/."""
    return (ROOT / name).is_file() or any(f"/{module.relative_to(ROOT)}".endswith(f"/{name}") for module in MODULES)


def test_the_design_names_only_modules_that_exist():
    assert sorted(name for name in named_files(DESIGN.read_text()) if not exists(name)) == []


def test_the_design_describes_every_module():
    text = DESIGN.read_text()
    missing = [str(module.relative_to(ROOT / "src")) for module in MODULES
               if module.stem != "__init__" and not re.search(rf"\b{module.stem}\b", text)]
    assert missing == []
