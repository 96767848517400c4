"""Training: the runner and coordinator, the loop, evaluation, checkpoints, progress, status and reports."""
