"""The MkDocs hook that writes the reference pages before every build, so they are never stale.

`reference/job-file.md` and `reference/cli.md` are made from shoal's own code by docs/generate.py
(`write_references(docs_dir)`); they are not kept in the repository. Running the generator here, at
the start of each build, means `mkdocs build` and `mkdocs serve` always show the keys and options of
the code being documented. The generator is imported by its path: docs/ is not a package.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.exceptions import PluginError

GENERATOR = Path(__file__).resolve().parent / "generate.py"


def on_pre_build(config) -> None:
    if not GENERATOR.is_file():
        raise PluginError(f"{GENERATOR.name}: missing beside {Path(__file__).name}; it writes the reference pages")
    spec = importlib.util.spec_from_file_location("shoal_docs_generate", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_references(Path(config["docs_dir"]))
