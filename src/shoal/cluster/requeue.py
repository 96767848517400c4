"""Requeue-friendly stops under SLURM: a warning before the time limit ends the job at the next epoch's
end with a checkpoint, and the job goes back in the queue to continue from it.

SLURM can warn a job before its time limit or a preemption (`sbatch --signal=USR1@120`). On
SIGUSR1 every rank finishes its epoch; the ranks agree at the epoch's end (one flag all-gathered,
so they stop at the same epoch), write a checkpoint there whether one is due or not, and exit
with EX_TEMPFAIL; rank 0 records the stop and asks SLURM to requeue the job (`scontrol requeue`,
for a job submitted with --requeue). The requeued job sees SLURM_RESTART_COUNT and continues from
that checkpoint (shoal.worker). SIGTERM (scancel, the limit itself) stops at once instead; the
newest checkpoint is whole either way (written, then renamed), and a requeued job resumes from it.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading

import torch

from shoal.errors import first_line

WARNING_SIGNAL = signal.SIGUSR1
EXIT_REQUEUED = 75  # EX_TEMPFAIL: not a failure; try again later


class StopRequested(Exception):
    """Every rank stopped together at the end of `epoch`, its checkpoint written."""

    def __init__(self, epochs_done: int):
        self.epochs_done = epochs_done
        super().__init__(f"stopped at the end of epoch {epochs_done} with its checkpoint "
                         f"({WARNING_SIGNAL.name}: SLURM's warning before its time limit); a requeued job "
                         "continues from it")


class EpochEndStop:
    """Set by the warning signal; read by every rank at each epoch's end."""

    def __init__(self):
        self.requested = threading.Event()

    def install(self) -> EpochEndStop:
        signal.signal(WARNING_SIGNAL, lambda number, frame: self.requested.set())
        return self

    def agreed(self, comm) -> bool:
        """Whether any rank was warned: all stop at this epoch's end, or none."""
        flags = comm.all_gather(torch.tensor([1.0 if self.requested.is_set() else 0.0], dtype=torch.float64))
        return bool(flags.max() > 0)


def requeue(job_id: str | None) -> str:
    """Ask SLURM to put the job back in its queue; what happened, in words."""
    if not job_id:
        return "not a SLURM batch job: start it again to continue"
    if shutil.which("scontrol") is None:
        return f"no scontrol here: requeue it with `scontrol requeue {job_id}` to continue"
    try:
        subprocess.run(["scontrol", "requeue", job_id], check=True, capture_output=True, text=True, timeout=30)
    except (subprocess.SubprocessError, OSError) as error:
        detail = getattr(error, "stderr", None) or first_line(error)
        return f"`scontrol requeue {job_id}` failed ({detail.strip()}): requeue it to continue"
    return f"requeued as SLURM job {job_id}: it continues from this checkpoint"
