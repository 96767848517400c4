"""The run directory: the folder a job writes, the lock that keeps it to one job, the trained model it holds,
and the readers of its event log (`shoal status`, `shoal report`).

What a run leaves on disk and what reads it back, apart from the loop that writes it: the launcher names
and locks the folder before any worker starts, `shoal status` folds events.jsonl without importing torch,
and predicting or exporting starts from model.pt. Training imports this package (to save model.pt, to
name machines in its loggers), never the reverse. Two things written into the folder stay with training:
checkpoints (`shoal.train.checkpoint`, `shoal.train.manifest`), whose content is the loop's state, and the
failures recorded under torchrun, srun or mpirun (`shoal.train.exits`), which rank 0 of the running job
gathers through the job's store and torch.distributed and which reach the folder only as events.
"""
