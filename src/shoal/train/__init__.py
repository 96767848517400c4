"""Training: the runner and coordinator, the loop, evaluation, checkpoints, progress, and the failures its workers
record under torchrun, srun or mpirun. The run directory and its readers (status, report) are shoal.run;
predicting and exporting a trained model are shoal.inference."""
