"""An import's stop signal handler is set only while it writes: outside a write, SIGTERM is as it was.

What a real process leaves behind when stopped or killed is in tests/processes/data/test_leaks.py.
"""

from __future__ import annotations

import signal
import tempfile

import numpy as np
import pytest

from shoal.data.format import DatasetWriter


@pytest.mark.skipif(signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, reason="SIGTERM has a handler here")
def test_a_stop_signal_keeps_its_handler_outside_a_write():
    before = signal.getsignal(signal.SIGTERM)
    with tempfile.TemporaryDirectory() as folder:
        with DatasetWriter(f"{folder}/out", (1,), "float32") as writer:
            writer.write(np.zeros((2, 1)), np.array([0, 1]))
            assert signal.getsignal(signal.SIGTERM) is not before  # removes the temporary, then ends
        assert signal.getsignal(signal.SIGTERM) is before
