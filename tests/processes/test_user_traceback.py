"""An error in the user's own step, through real workers: `shoal train` with a step in the user's file, and
`shoal.fit` with a step sent by value. The user sees the traceback (the worker's stderr, which the launcher
passes on) with the file and the raising line, not cloudpickle's `<dynamic-code>`, and the run's `job_end`
keeps it. The parts, without processes: tests/unit/test_user_traceback.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from shoal.data.format import DatasetWriter

TIMEOUT = 180
"""Each run takes about 5 s (10 s on a loaded machine)."""
RAISING_LINE = 10
"""The line of `raise` in the step's file below."""
STEP = textwrap.dedent('''\
    """A step that fails two calls down."""


    def step(model, batch):
        inputs, labels = batch
        return helper(inputs)


    def helper(inputs):
        raise ValueError("my step is broken")
    ''')
FIT = STEP + textwrap.dedent('''\


    if __name__ == "__main__":
        import shoal

        shoal.fit({"model": {"layers": [{"dense": 2}]}, "data": {"train": "train"}}, step=step, workers=1,
                  run_dir="run")
    ''')


@pytest.fixture
def folder(tmp_path) -> Path:
    """A folder with a small dataset, `train`."""
    generator = np.random.default_rng(0)
    with DatasetWriter(str(tmp_path / "train"), (4,), "float32") as writer:
        writer.write(generator.normal(size=(200, 4)).astype(np.float32), np.where(np.arange(200) % 2, "a", "b"))
    return tmp_path


def job_end(run_dir: Path) -> dict:
    ends = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
            if json.loads(line)["event"] == "job_end"]
    assert len(ends) == 1
    return ends[0]


def check_traceback(text: str, file: str) -> None:
    """`text` holds the user's traceback, its file and the raising line."""
    assert "Traceback (most recent call last):" in text, text
    assert f'{file}", line {RAISING_LINE}, in helper\n    raise ValueError("my step is broken")' in text, text
    assert "<dynamic-code>" not in text


def test_shoal_train_shows_and_records_the_traceback_of_the_user_s_step(folder, project_env):
    (folder / "mystep.py").write_text(STEP)
    (folder / "job.toml").write_text('[model]\nlayers = [{ dense = 2 }]\n[data]\ntrain = "train"\n'
                                     '[train]\nstep = "mystep:step"\n')
    finished = subprocess.run([sys.executable, "-m", "shoal", "train", "job.toml", "--workers", "1", "--run-dir",
                               "run"], cwd=folder, env=project_env, capture_output=True, text=True, timeout=TIMEOUT)
    assert finished.returncode == 2, finished.stderr
    check_traceback(finished.stderr, "mystep.py")
    assert finished.stderr.strip().splitlines()[-1].endswith("train.step: ValueError: my step is broken")
    end = job_end(folder / "run")
    assert end["status"] == "failed" and end["traceback"].endswith("ValueError: my step is broken")
    check_traceback(end["traceback"], "mystep.py")
    assert end["traceback"].splitlines()[1].endswith(", in step")  # the user's first frame, no shoal frame before


def test_a_step_shoal_fit_sends_by_value_keeps_its_file_name(folder, project_env):
    (folder / "fit_script.py").write_text(FIT)
    finished = subprocess.run([sys.executable, "fit_script.py"], cwd=folder, env=project_env, capture_output=True,
                              text=True, timeout=TIMEOUT)
    assert finished.returncode != 0 and "WorkerError" in finished.stderr, finished.stderr
    check_traceback(finished.stderr, "fit_script.py")
    check_traceback(job_end(folder / "run")["traceback"], "fit_script.py")
