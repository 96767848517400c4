"""RUN_DIR/tensorboard/: the run's scalars and settings for `tensorboard --logdir RUN_DIR/tensorboard`.

Written with torch's SummaryWriter (which needs the tensorboard package: `shoal[tensorboard]`).
Each scalar keeps the time of its record, and its step is the epoch, the validation's count or
the global step: a resumed job opens a new event file in the same folder and its curves go on
where they stopped. The job's settings are hyperparameters (the HPARAMS tab, written once, when
the job starts) and text (the TEXT tab, at every start or resumption). In a job whose machines
change, each set of machines is text too (`cluster/membership`, at the epoch it goes on from), and
every epoch has its world size (`cluster/world_size`).
"""

from __future__ import annotations

import json
from pathlib import Path

from shoal.events import Event, JobStart, Membership
from shoal.run.status import machines_text
from shoal.safe_files import refuse_links_within
from shoal.train.loggers.scalars import WorldSize, parameters, scalars

TENSORBOARD_FOLDER = "tensorboard"
MEMBERSHIP_TAG = "cluster/membership"


class TensorBoardLogger:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        folder = Path(run_dir) / TENSORBOARD_FOLDER
        refuse_links_within(folder)  # its event files' names are foreseeable (time, host, pid); opened by name
        self.writer = SummaryWriter(log_dir=str(folder))
        self.world_size = WorldSize()

    def write(self, event: Event) -> None:
        self.world_size.follow(event)
        if isinstance(event, JobStart):
            self.settings(event)
            return
        if isinstance(event, Membership):
            self.writer.add_text(MEMBERSHIP_TAG, f"attempt {event.attempt}: {machines_text(event)}", event.from_epoch,
                                 walltime=event.time)
            self.writer.flush()
            return
        found = scalars(event, self.world_size.value)
        if found is None:
            return
        for name, value in found.values.items():
            self.writer.add_scalar(name, value, found.step, walltime=found.time)
        self.writer.flush()

    def settings(self, event: JobStart) -> None:
        from torch.utils.tensorboard.summary import hparams

        text = json.dumps(event.config, indent=2)
        self.writer.add_text("job/config", f"```\n{text}\n```", event.from_epoch, walltime=event.time)
        if type(event) is JobStart:  # written beside the scalars (add_hparams would open a folder of its own)
            for summary in hparams(parameters(event), {}):
                self.writer.file_writer.add_summary(summary, walltime=event.time)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
