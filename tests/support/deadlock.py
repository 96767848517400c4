"""A user's training step that deadlocks on one worker, named in job files as 'tests.support.deadlock:step'.

On rank 1, at its AT-th training step, the step blocks forever on an event no one sets, as a step stuck on
a lock would: the worker's heartbeat thread beats on. It first creates the file that DEADLOCK_MARKER names
(an environment variable), so the test knows when, and a worker that finds the file (the restarted attempt)
never blocks.
"""

from __future__ import annotations

import os
import threading

from torch.nn import functional

MARKER = "DEADLOCK_MARKER"
RANK = "1"
AT = 47 + 10  # epoch 2's tenth step, with 6000 rows, 2 workers and batches of 64 (47 steps an epoch)

_never = threading.Event()
_steps = 0


def step(model, batch):
    """Cross-entropy, as the job's own loss would be; the deadlock on cue."""
    global _steps
    if model.training and os.environ.get("RANK") == RANK:
        _steps += 1
        marker = os.environ.get(MARKER)
        if _steps == AT and marker and not os.path.exists(marker):
            open(marker, "w").close()
            _never.wait()
    inputs, labels = batch
    return functional.cross_entropy(model(inputs), labels)
