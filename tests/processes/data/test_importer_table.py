"""What importing the importers leaves out, each in a fresh interpreter.

Importing the package must not import h5py: only an HDF5 import needs it, and it is slow to load.
Building the CLI's parser must not import the importers at all, so that `shoal --help` stays fast.
"""

from __future__ import annotations

import subprocess
import sys


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
