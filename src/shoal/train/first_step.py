"""A resume that fails before its first step is not made again from the same checkpoint.

A checkpoint can load and pass every check (`manifest`, `state_checks`) and still fail the job at
once, on every restart from it. So each rank notes, in its run directory, the checkpoint it resumes
from before it applies any of it (`checkpoints/resumed-rank-NNNNN.json`: the epoch and the id of the
save that wrote it), and clears the note once it has finished its first step (a trainer's first
step, a server's first update) or the job has ended without one. A note still there when the rank
resumes again means that the last resume failed before its first step (whatever stopped it: an
error, a kill, an interrupt): the save joins the note's list of failed ones, and the rank passes over
its own file of it, with a warning naming the file, as over a damaged one, so that the ranks agree
on the epoch before it (`checkpoint.agree_on_latest`). A rank all of whose checkpoints failed so
tries the newest again rather than none. The launcher's `job_restarted` (`checkpoint.newest_epoch`)
passes over the saves that the notes in the first machine's run directory name.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from shoal.durable import write_text_durably
from shoal.safe_files import make_folder, open_file

NOTE = "resumed-rank-{rank:05d}.json"
PATTERN = "resumed-rank-*.json"
Save = tuple[int, "str | None"]
"""A checkpoint as a note names it: its epoch and the id of the save that wrote it (None in old ones)."""


def _save(entry) -> Save | None:
    """A note's [epoch, save id] as a Save, None when it is not one."""
    if (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int) and not isinstance(entry[0], bool)
            and (entry[1] is None or isinstance(entry[1], str))):
        return entry[0], entry[1]
    return None


def read_note(path: Path) -> tuple[Save | None, list[Save]]:
    """(the save being resumed from, the saves that failed before) in a note; (None, []) without one. A note
    that cannot be read counts as none, with a warning."""
    try:
        with os.fdopen(open_file(path, os.O_RDONLY), "rb") as handle:
            content = json.loads(handle.read().decode("utf-8"))
        resuming, failed = content["resuming"], [_save(entry) for entry in content["failed"]]
    except FileNotFoundError:
        return None, []
    except (OSError, ValueError, KeyError, TypeError) as error:  # not JSON, or not a note
        warnings.warn(f"{path.parent.name}/{path.name}: not a note of a resume ({type(error).__name__}); "
                      "ignored", stacklevel=2)
        return None, []
    return _save(resuming), [save for save in failed if save is not None]


def failed_saves(checkpoints: Path) -> set[Save]:
    """Every save that a note in the folder `checkpoints` names as failed, or as resumed from without a first
    step yet (as the launcher sees them after a failed attempt)."""
    found: set[Save] = set()
    for path in Path(checkpoints).glob(PATTERN):
        resuming, failed = read_note(path)
        found.update(failed + ([resuming] if resuming is not None else []))
    return found


class FirstStep:
    """One rank's note of the checkpoint it resumes from, kept until the rank has finished its first step."""

    def __init__(self, checkpoints: Path, rank: int):
        self.checkpoints = Path(checkpoints)
        self.path = self.checkpoints / NOTE.format(rank=rank)
        resuming, self.failed = read_note(self.path)
        if resuming is not None and resuming not in self.failed:  # the last resume never finished a step
            self.failed.append(resuming)
        self.resuming: Save | None = None

    def begin(self, epoch: int, save: str | None) -> None:
        """Before any of checkpoint `epoch` is applied: note it, on disk."""
        make_folder(self.checkpoints, exist_ok=True)
        self.resuming = (epoch, save)
        self.write([epoch, save])

    def done(self) -> None:
        """The first step is done (or the job ended): the note goes, or keeps only the other saves that failed
        (this one, tried again when none was left, failed no more)."""
        if self.resuming is None:
            return
        self.failed = [failed for failed in self.failed if failed != self.resuming]
        self.resuming = None
        if self.failed:
            self.write(None)
        else:
            self.path.unlink(missing_ok=True)

    def write(self, resuming: list | None) -> None:
        note = {"resuming": resuming, "failed": [list(save) for save in self.failed]}
        write_text_durably(self.path, json.dumps(note))
