"""`shoal.fit(..., workers=0)`: the whole job in the caller's process, to debug it (shoal.in_process).

A `breakpoint()` in the user's transform, step and model stops at pdb's prompt on the caller's terminal (pdb
driven on standard input, in a process of its own); the job trains the weights one worker does, into a run
directory with the same events; the user's own exception reaches the caller as raised, for a post-mortem, and
the process is as it was for the next fit."""

from __future__ import annotations

import bdb
import random
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

import shoal
from shoal.errors import ConfigError
from shoal.events import EpochEnd, JobEnd, JobStart, WorkerFailed, read_history

TIMEOUT = 120
"""Seconds the pdb script may take (it takes about 5 s: torch's import and one short epoch)."""
SETTINGS = {"epochs": 2, "batch_size": 32, "optimizer": {"name": "adam", "lr": 0.01},
            "output": {"progress": "none"}, "checkpoint": {"every": 0}, "cluster": {"threads": 1}}

SCRIPT = textwrap.dedent("""\
    import numpy as np
    import torch
    from torch import nn

    import shoal

    generator = np.random.default_rng(0)
    features = generator.normal(size=(256, 4)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int64)
    stopped = set()


    def stop_once(where):
        if where not in stopped:
            stopped.add(where)
            return True
        return False


    class Network(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 2)

        def forward(self, inputs):
            where, rows = "forward", len(inputs)
            if self.training and stop_once(where):  # not the checks' probe, which runs in eval mode
                breakpoint()
            return self.layer(inputs)


    def transform(batch):
        where, rows = "transform", len(batch[1])
        if stop_once(where):
            breakpoint()
        return batch


    def step(model, batch):
        inputs, targets = batch
        where, rows = "step", len(targets)
        if stop_once(where):
            breakpoint()
        return nn.functional.cross_entropy(model(inputs), targets)


    result = shoal.fit(model=Network(), train=(features, labels), step=step, transform=transform, workers=0,
                       epochs=1, batch_size=32, run_dir="run", output={"progress": "none"},
                       checkpoint={"every": 0})
    print("fit returned after", len(result.epochs), "epoch; stopped in", sorted(stopped))
""")


def test_a_breakpoint_in_the_transform_the_step_and_the_model_stops_at_pdb_s_prompt(tmp_path, project_env):
    env = {**project_env, "PYTHONBREAKPOINT": "pdb.set_trace"}  # breakpoint()'s default, whatever the caller set
    commands = "p where, rows\nc\n" * 3  # one stop each; a fourth would read the end of input and quit
    finished = subprocess.run([sys.executable, "-c", SCRIPT], input=commands, cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    output = finished.stdout
    assert output.count("(Pdb) ") == 6, output  # a prompt for each command
    for where in ("transform", "step", "forward"):  # stopped in each, and printed its local variables
        assert f"{where}()\n" in output and f"('{where}', 32)" in output, output
    assert "fit returned after 1 epoch; stopped in ['forward', 'step', 'transform']" in output, output


def data(rows: int = 512) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(0)
    features = generator.normal(size=(rows, 4)).astype(np.float32)
    return features, (features[:, 0] - features[:, 1] > 0).astype(np.int64)


def network() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))


def jitter(batch):
    """Random, from the generators shoal seeds for each step: the same draws in any process."""
    inputs, labels = batch
    return inputs + 0.05 * torch.randn_like(inputs), labels


def caller_state() -> tuple:
    return torch.get_num_threads(), torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


def same_state(before: tuple, after: tuple) -> bool:
    return (before[0] == after[0] and torch.equal(before[1], after[1]) and np.array_equal(before[2], after[2])
            and before[3] == after[3])


def test_in_process_trains_the_weights_of_one_worker_with_the_same_events(tmp_path):
    steps = []

    def step(model, batch):
        steps.append(len(batch[1]))  # the caller's own function: this list, not a copy's
        inputs, labels = batch
        return nn.functional.cross_entropy(model(inputs), labels)

    train, test = data(), data(128)
    runs = {}
    for name, workers in (("here", 0), ("worker", 1), ("here-again", 0)):
        model, taken = network(), len(steps)
        before = caller_state()
        runs[name] = shoal.fit(model=model, train=train, test=test, step=step, transform=jitter, workers=workers,
                               run_dir=tmp_path / name, **SETTINGS)
        assert (len(steps) > taken) == (workers == 0)  # a worker process calls a copy
        if workers == 0:  # torch's threads and the random generators are the caller's again
            assert same_state(before, caller_state())
    weights = {name: run.model.state_dict() for name, run in runs.items()}
    for name in ("worker", "here-again"):
        assert weights[name].keys() == weights["here"].keys()
        assert all(torch.equal(weights[name][key], weights["here"][key]) for key in weights["here"]), name
    for name, run in runs.items():
        history = read_history(run.run_dir)
        kinds = [type(event) for event in history.events]
        assert kinds[0] is JobStart and kinds.count(EpochEnd) == 2 and kinds[-1] is JobEnd, (name, kinds)
        assert history.end.completed and history.start.world_size == 1
        assert run.metrics == runs["here"].metrics


class Refused(Exception):
    """The user's own error."""


def refusing_step(model, batch):
    raise Refused("no batch today")


def test_the_user_s_error_reaches_the_caller_as_raised_and_the_next_fit_runs(tmp_path):
    model = network()
    before = caller_state()
    with pytest.raises(Refused, match="no batch today") as raised:
        shoal.fit(model=model, train=data(), step=refusing_step, workers=0, run_dir=tmp_path / "failed", **SETTINGS)
    innermost = raised.tb
    while innermost.tb_next is not None:
        innermost = innermost.tb_next
    assert innermost.tb_frame.f_code is refusing_step.__code__  # where a post-mortem debugger stops
    assert any(note.startswith("shoal.fit(workers=0): train.step: Refused: no batch today")
               for note in raised.value.__notes__)
    assert same_state(before, caller_state())
    history = read_history(tmp_path / "failed")
    failure, end = history.last(WorkerFailed), history.end
    assert failure.rank == 0 and failure.message == "UserCodeError: train.step: Refused: no batch today"
    assert end.status == "failed" and end.message.endswith("failed: UserCodeError: train.step: Refused: no batch today")
    again = shoal.fit(model=network(), train=data(), workers=0, run_dir=tmp_path / "again", **SETTINGS)
    assert read_history(again.run_dir).end.completed


@pytest.mark.parametrize("stop, how", [(KeyboardInterrupt, "SIGINT"), (bdb.BdbQuit, "quitting the debugger")])
def test_ctrl_c_or_the_debugger_s_quit_ends_the_run_as_interrupted(tmp_path, stop, how):
    def step(model, batch):
        raise stop()

    with pytest.raises(stop):
        shoal.fit(model=network(), train=data(), step=step, workers=0, run_dir=tmp_path / "run", **SETTINGS)
    end = read_history(tmp_path / "run").end
    assert end.status == "interrupted" and end.message == f"stopped by {how}"


@pytest.mark.parametrize("workers", [-1, True, 1.0, "0"])
def test_fit_names_its_worker_count_and_zero_as_the_least(tmp_path, workers):
    expected = f"workers: must be an integer >= 0 (0: the job in this process, to debug it), got {workers!r}"
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}$"):
        shoal.fit(model=network(), train=data(), workers=workers, run_dir=tmp_path / "run", **SETTINGS)
    assert not (tmp_path / "run").exists()
