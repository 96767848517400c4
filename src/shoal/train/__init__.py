"""Training: the loop, evaluation, the job runner, events, progress and saved models."""
