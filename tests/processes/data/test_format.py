"""Reading a dataset in a fresh interpreter: what it leaves unimported."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from shoal.data.format import DatasetWriter


def test_reading_numeric_labels_does_not_import_pandas(tmp_path):
    # pyarrow's to_numpy imports pandas whenever it is installed: seconds and memory in every worker
    with DatasetWriter(str(tmp_path / "set"), (2,), "float32") as writer:
        writer.write(np.ones((10, 2), dtype=np.float32), np.arange(10) % 2)
    code = (f"import sys; from shoal.data.format import open_dataset; open_dataset({str(tmp_path / 'set')!r})"
            ".read_all(); print('pandas' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
