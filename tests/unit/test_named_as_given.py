"""Errors name what the user gave: a bad `--set` key is blamed on the `--set`, not on the job file that never held
it, and fit's worker count on fit's argument, not the command's option; and `shoal.events`, which the README uses
after `import shoal`, is there without its own import."""

from __future__ import annotations

import pytest

from shoal.errors import ConfigError
from shoal.jobs import load_job

JOB = """
[model]
layers = [{ dense = 2 }]
[data]
train = "train"
[train]
epochs = 1
"""


def test_an_unknown_key_given_by_set_is_blamed_on_the_set(tmp_path):
    job = tmp_path / "cnn.toml"
    job.write_text(JOB)
    with pytest.raises(ConfigError, match=r"^--set 'train\.epoch=3': train\.epoch: unknown key"):
        load_job(job, ["train.epoch=3"])
    with pytest.raises(ConfigError, match=r"^--set 'train\.epochs=0': train\.epochs: "):
        load_job(job, ["train.epochs=0"])


def test_an_unknown_key_in_the_file_is_still_blamed_on_the_file(tmp_path):
    job = tmp_path / "cnn.toml"
    job.write_text(JOB.replace("epochs = 1", "epoch = 1"))
    with pytest.raises(ConfigError, match=rf"^{tmp_path}/cnn\.toml: train\.epoch: unknown key"):
        load_job(job, ["train.batch_size=8"])


def test_shoal_s_modules_are_there_after_import_shoal():
    import shoal

    # asked of the package's own lookup: another test may have imported shoal.events already
    assert callable(shoal.__getattr__("events").read_history)
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        shoal.__getattr__("no_such_thing")


def test_fit_s_worker_count_is_named_as_fit_s_argument(tmp_path):
    import shoal

    job = {"model": {"layers": [{"dense": 2}]}, "data": {"train": str(tmp_path / "train")}}
    with pytest.raises(ConfigError, match=r"^workers: must be an integer >= 0 \(0: the job in this process, to "
                                          r"debug it\), got -1$"):
        shoal.fit(job, workers=-1, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
