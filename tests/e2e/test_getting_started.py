"""docs/getting-started.md's first job, run as the page writes it, so the page cannot drift from shoal.

A block the page marks `<!-- runs -->` (a ```sh block) is run by bash, stopping at its first failing
line; one marked `<!-- writes FILE -->` is written to FILE first. They run in the page's order, in a
fresh folder, with this project's virtual environment first on PATH, as a reader's shell would have it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"
MARKER = re.compile(r"<!-- (runs|writes \S+) -->")
MARKED = re.compile(r"<!-- (runs|writes \S+) -->\n```(\w*)\n(.*?)^```$", re.S | re.M)
STEP_SECONDS = 90
"""One step's limit (a hang guard): the longest, training, takes about 10 s on 2 cores; all of them 13 s."""
ACCURACY = re.compile(r"final loss [0-9.]+ +accuracy ([0-9.]+)")
CLAIMED_ACCURACY = 0.9
"""The page says the first job ends near 0.95."""


def steps(text: str) -> list[tuple[str, str]]:
    """(marker, code) of each marked block, in the page's order; a marker on anything else is an error."""
    found = [(marker, language, code) for marker, language, code in MARKED.findall(text)]
    assert len(found) == len(MARKER.findall(text)), f"{PAGE.name}: a marker must come right before a fenced block"
    assert all(language == "sh" for marker, language, _ in found if marker == "runs"), \
        f"{PAGE.name}: <!-- runs --> marks ```sh blocks only"
    return [(marker, code) for marker, _, code in found]


def test_the_marker_reader_takes_blocks_in_order_and_only_fenced_ones():
    text = "<!-- writes a.toml -->\n```toml\nx = 1\n```\n\n<!-- runs -->\n```sh\necho hi\n```\n"
    assert steps(text) == [("writes a.toml", "x = 1\n"), ("runs", "echo hi\n")]
    with pytest.raises(AssertionError, match="must come right before a fenced block"):
        steps("<!-- runs -->\nprose\n")


@pytest.mark.timeout(300)
def test_the_first_job_runs_as_the_page_writes_it(tmp_path, project_env):
    environment = {**project_env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), project_env["PATH"]])}
    page_steps = steps(PAGE.read_text())
    assert [marker for marker, _ in page_steps].count("runs") >= 3  # data, training, using the model
    outputs = []
    for marker, code in page_steps:
        if marker.startswith("writes "):
            (tmp_path / marker.removeprefix("writes ")).write_text(code)
            continue
        done = subprocess.run(["bash", "-e", "-c", code], cwd=tmp_path, env=environment, capture_output=True,
                              text=True, timeout=STEP_SECONDS)
        assert done.returncode == 0, f"{code}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    accuracy = ACCURACY.search("\n".join(outputs))
    assert accuracy and float(accuracy.group(1)) > CLAIMED_ACCURACY
    assert (tmp_path / "predictions.parquet").is_file() and (tmp_path / "runs" / "digits" / "loss.png").is_file()
