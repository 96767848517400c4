"""RUN_DIR/tensorboard/: the run's scalars and settings for `tensorboard --logdir RUN_DIR/tensorboard`.

Written with torch's SummaryWriter (which needs the tensorboard package: `shoal[tensorboard]`).
Each scalar keeps the time of its record, and its step is the epoch, the validation's count or
the global step: a resumed job opens a new event file in the same folder and its curves go on
where they stopped. The job's settings are hyperparameters (the HPARAMS tab, written once, when
the job starts) and text (the TEXT tab, at every start or resumption).
"""

from __future__ import annotations

import json
from pathlib import Path

from shoal.events import Event, JobStart
from shoal.safe_files import refuse_links_within
from shoal.train.loggers.scalars import parameters, scalars

TENSORBOARD_FOLDER = "tensorboard"


class TensorBoardLogger:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        folder = Path(run_dir) / TENSORBOARD_FOLDER
        refuse_links_within(folder)  # its event files' names are foreseeable (time, host, pid); opened by name
        self.writer = SummaryWriter(log_dir=str(folder))

    def write(self, event: Event) -> None:
        if isinstance(event, JobStart):
            self.settings(event)
            return
        found = scalars(event)
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
