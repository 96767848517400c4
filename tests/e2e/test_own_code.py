"""`shoal.fit` with the user's own code, as a user coming from Accelerate or Lightning writes it: a training step
over dict batches with an extra loss term, a random transform every epoch, parameter groups, a scheduler built
by a function, a metric of their own, a held-out validation share; each under real worker processes."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score
from torch import nn

import shoal
from shoal.errors import ConfigError, ShoalError
from shoal.events import read_events
from shoal.inference.export import export
from tests.e2e.jobs import FEATURES, write_task

ROWS, TEST_ROWS, BATCH = 1200, 300, 50
SETTINGS = {"epochs": 3, "batch_size": BATCH, "output": {"progress": "none", "loggers": ["csv"]}}
pytestmark = pytest.mark.timeout(180)


def task(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(seed)
    features = generator.normal(size=(rows, FEATURES)).astype(np.float32)
    return features, (features[:, 0] * features[:, 1] + features[:, 2] > 0).astype(np.int64)


class Rows(torch.utils.data.Dataset):
    """Dict items, as a Hugging Face style Dataset gives them: features, a row id, and the label."""

    def __init__(self, rows: int, seed: int):
        self.features, self.labels = task(rows, seed)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return {"x": self.features[index], "id": index, "label": self.labels[index]}


class Network(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = nn.Linear(FEATURES, 32), nn.Linear(32, 2)

    def forward(self, inputs):
        return self.out(torch.relu(self.hidden(inputs)))


def step(model, batch):
    """Cross-entropy plus a small penalty on the logits: a loss shoal's names cannot say."""
    logits = model(batch["x"])
    task_loss = nn.functional.cross_entropy(logits, batch["label"])
    penalty = 1e-3 * logits.pow(2).mean()
    return {"loss": task_loss + penalty, "penalty": penalty, "task_loss": task_loss}


def epoch_ends(run_dir: Path) -> list[dict]:
    return [event for event in read_events(run_dir) if event["event"] == "epoch_end"]


@pytest.mark.parametrize("algorithm,workers", [("sync", 2), ("averaging", 2), ("downpour", 3)])
def test_a_step_of_your_own_on_dict_batches_trains_under_each_algorithm(algorithm, workers, tmp_path):
    result = shoal.fit(model=Network(), train=Rows(ROWS, 0), test=Rows(TEST_ROWS, 1), step=step, workers=workers,
                       algorithm=algorithm, optimizer={"name": "adam", "lr": 0.01}, run_dir=tmp_path / "run",
                       **SETTINGS)
    ends = epoch_ends(result.run_dir)
    assert len(ends) == 3
    for end in ends:  # the step's numbers, as means over every trainer's rows
        logged = end["train_metrics"]
        assert set(logged) == {"penalty", "task_loss"}
        assert math.isclose(end["train_loss"], logged["task_loss"] + logged["penalty"], rel_tol=1e-4)
    assert ends[-1]["train_loss"] < ends[0]["train_loss"]
    assert result.metrics["loss"] < 0.6  # the test set is evaluated by the step too (dict rows)
    assert set(result.metrics) == {"loss", "penalty", "task_loss"}
    with open(result.run_dir / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert "test.accuracy" not in rows[0]  # the step evaluates the test set: its loss and what it logs
    assert [float(row["test.task_loss"]) for row in rows] == pytest.approx([e["test"]["task_loss"] for e in ends])
    assert [float(row["train_metrics.penalty"]) for row in rows] == pytest.approx([e["train_metrics"]["penalty"]
                                                                           for e in ends])
    if algorithm == "sync":  # the model takes what the step made of the fields: no file taking stored rows
        with pytest.raises(ShoalError, match=r"trained on rows of named fields \(x, id\).*safetensors"):
            export(result.run_dir, "torchscript", tmp_path / "model.pt")
        assert not (tmp_path / "model.pt").exists()


def test_a_random_transform_runs_on_every_row_every_epoch_and_a_restart_keeps_its_draws(tmp_path):
    log = tmp_path / "draws"
    log.mkdir()

    def jitter(batch):
        """Noise on the features, drawn anew each epoch; each draw recorded by row id."""
        noise = torch.randn(len(batch["x"]), 1) * 0.1
        with open(log / f"{torch.initial_seed()}-{np.random.randint(1 << 30)}.npy", "wb") as file:
            np.save(file, np.stack([batch["id"].numpy().astype(np.float64), noise[:, 0].double().numpy()]))
        return batch | {"x": batch["x"] + noise}

    runs = {}
    for name, restarts, model in (("uninterrupted", 0, {"action": "none"}), ("killed", 1, {"action": "kill"})):
        arguments = {"features": FEATURES, "at": 30, "marker": str(tmp_path / "fired"), **model}
        runs[name] = shoal.fit(model={"factory": "tests.support.models:sabotaged", "arguments": arguments},
                               train=Rows(ROWS, 0), test=Rows(TEST_ROWS, 1), step=step, transform=jitter, workers=2,
                               algorithm="sync", optimizer={"name": "sgd", "lr": 0.1}, max_restarts=restarts,
                               run_dir=tmp_path / name, **SETTINGS)
        if name == "uninterrupted":
            draws = np.concatenate([np.load(path) for path in log.iterdir()], axis=1)
            for path in log.iterdir():
                path.unlink()
    assert (tmp_path / "fired").exists()
    assert any(event["event"] == "job_restarted" for event in read_events(runs["killed"].run_dir))
    ids, noise = draws[0].astype(int), draws[1]
    assert np.array_equal(np.bincount(ids, minlength=ROWS), np.full(ROWS, 3))  # every row, once an epoch
    order = np.argsort(ids, kind="stable")
    per_row = noise[order].reshape(ROWS, 3)
    assert (per_row[:, 0] != per_row[:, 1]).all() and (per_row[:, 1] != per_row[:, 2]).all()
    for ours, theirs in zip(runs["killed"].model.parameters(), runs["uninterrupted"].model.parameters(),
                            strict=True):
        assert torch.equal(ours, theirs)


def warm_then_cosine(optimizer):
    warm = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=10)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=50)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, cosine], milestones=[10])


def f1(outputs, labels):
    return f1_score(labels.numpy(), outputs.argmax(dim=1).numpy())


def test_groups_a_scheduler_function_and_a_metric_resume_exactly(tmp_path):
    """Two layers at their own rates, warm-up then cosine per step, F1 on the test set; a worker killed in the
    second epoch and restarted from the checkpoint ends where the uninterrupted run does."""
    train, test = task(ROWS, 0), task(TEST_ROWS, 1)
    runs = {}
    for name, restarts, action in (("uninterrupted", 0, "none"), ("killed", 1, "kill")):
        arguments = {"features": FEATURES, "at": 30, "marker": str(tmp_path / "fired"), "action": action}
        runs[name] = shoal.fit(
            model={"factory": "tests.support.models:sabotaged", "arguments": arguments}, train=train, test=test,
            workers=2, optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9,
                                  "param_groups": [{"params": r"^inner\.0\.", "lr": 0.1}]},
            scheduler={"factory": warm_then_cosine, "interval": "step"}, metrics={"f1": f1},
            max_restarts=restarts, run_dir=tmp_path / name, **SETTINGS)
    killed, uninterrupted = runs["killed"], runs["uninterrupted"]
    assert any(event["event"] == "job_restarted" for event in read_events(killed.run_dir))
    for ours, theirs in zip(killed.model.parameters(), uninterrupted.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    checkpoint = torch.load(sorted((killed.run_dir / "checkpoints").glob("epoch-*"))[-1] / "rank-00000.pt",
                            weights_only=False)
    groups = checkpoint["optimizer"]["param_groups"]
    steps = 3 * (ROWS // 2 // BATCH)
    expected = warm_then_cosine(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0))
    for _ in range(steps):
        expected.optimizer.step()
        expected.step()
    factor = expected.get_last_lr()[0]
    assert sorted(group["lr"] for group in groups) == pytest.approx([0.05 * factor, 0.1 * factor])
    assert killed.metrics["f1"] == uninterrupted.metrics["f1"]
    predicted = killed.model(torch.from_numpy(test[0])).argmax(dim=1).numpy()
    assert killed.metrics["f1"] == pytest.approx(f1_score(test[1], predicted), abs=1e-9)


def test_each_worker_reports_its_held_out_rows_and_a_loss_object_is_the_loss(tmp_path):
    weighted = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 3.0]))
    test = task(TEST_ROWS, 1)
    result = shoal.fit(model=Network(), train=task(ROWS, 0), test=test, workers=2, loss=weighted,
                       validation_split=0.2, run_dir=tmp_path / "run", optimizer={"name": "adam", "lr": 0.01},
                       **SETTINGS)
    with torch.no_grad():
        expected = weighted(result.model(torch.from_numpy(test[0])), torch.from_numpy(test[1]))
    assert result.metrics["loss"] == pytest.approx(float(expected), rel=1e-5)
    ends = epoch_ends(result.run_dir)
    assert [end["samples"] for end in ends] == [ROWS - 240] * 3  # 20% of the rows never trained on
    for end in ends:
        per_worker = [worker["validation"] for worker in end["workers"]]
        assert [found["rows"] for found in per_worker] == [120, 120]
        weighted = sum(found["accuracy"] * found["rows"] for found in per_worker) / 240
        assert end["validation"]["accuracy"] == pytest.approx(weighted)
        assert end["validation"]["rows"] == 240
    assert ends[-1]["validation"]["loss"] < ends[0]["validation"]["loss"]


def pair_step(model, batch):
    inputs, labels = batch
    return nn.functional.cross_entropy(model(inputs), labels)


def test_a_run_directory_naming_code_is_not_resumed_unasked(tmp_path):
    train, _ = write_task(tmp_path, rows=400, test_rows=10)
    result = shoal.fit(model=[{"dense": 2}], train=train, step=pair_step, workers=1, epochs=1, batch_size=BATCH,
                       output={"progress": "none"}, run_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"job.toml: train.step 'train.step.pkl' is code; resuming would run it: "
                                          r"pass --trust-code"):
        shoal.resume(result.run_dir, overrides=["train.epochs=2"])
    assert len(shoal.resume(result.run_dir, overrides=["train.epochs=2"], trust_code=True).epochs) == 2


def test_the_accelerate_port_trains_the_digits(tmp_path, project_env):
    """examples/accelerate_port.py as a user runs it: its step, transform and scheduler function on 2 workers."""
    script = Path(__file__).resolve().parents[2] / "examples" / "accelerate_port.py"
    finished = subprocess.run([sys.executable, str(script), "--rows", "6000", "--epochs", "2", "--data",
                               str(tmp_path / "data"), "--run-dir", str(tmp_path / "run")], cwd=tmp_path,
                              capture_output=True, text=True, env=project_env, timeout=120)
    assert finished.returncode == 0, finished.stderr[-3000:]
    ends = epoch_ends(tmp_path / "run")
    assert [sorted(end["train_metrics"]) for end in ends] == [["accuracy"], ["accuracy"]]
    assert ends[-1]["test"]["accuracy"] > 0.7
    assert "final:" in finished.stdout


def test_a_job_file_names_the_same_code_by_module(tmp_path, project_env):
    """`shoal train` with a job file: train.step, data.transform, a scheduler factory, a metric, parameter groups
    and a validation split, imported in every worker by name."""
    train, test = write_task(tmp_path)
    job = tmp_path / "job.toml"
    job.write_text(f"""
[model]
layers = [{{ dense = 16, activation = "relu" }}, {{ dense = 2 }}]
[data]
train = "{train}"
test = "{test}"
transform = "tests.support.own_code:jitter"
[algorithm]
name = "averaging"
reset_optimizer = true
[train]
epochs = 2
batch_size = 100
step = "tests.support.own_code:step"
metrics = {{ positives = "tests.support.own_code:positives" }}
validation_split = 0.1
optimizer = {{ name = "adam", lr = 0.01, param_groups = [{{ params = '^0\\.', lr = 0.002 }}] }}
scheduler = {{ factory = "tests.support.own_code:warm_up", interval = "step" }}
[output]
progress = "none"
""")
    finished = subprocess.run([sys.executable, "-m", "shoal", "train", str(job), "--workers", "2", "--run-dir",
                               str(tmp_path / "run")], capture_output=True, text=True, env=project_env, timeout=120)
    assert finished.returncode == 0, finished.stderr[-3000:]
    ends = epoch_ends(tmp_path / "run")
    assert [sorted(end["train_metrics"]) for end in ends] == [["penalty"], ["penalty"]]
    assert all(0 <= end["test"]["positives"] <= 1 and end["validation"]["rows"] == 600 for end in ends)
    checkpoint = torch.load(sorted((tmp_path / "run" / "checkpoints").glob("epoch-*"))[-1] / "rank-00000.pt",
                            weights_only=False)
    rates = [group["lr"] for group in checkpoint["optimizer"]["param_groups"]]
    assert rates == [pytest.approx(0.002), pytest.approx(0.01)]  # warmed up by then: the groups' own rates
    resumed = subprocess.run([sys.executable, "-m", "shoal", "train", "--resume", str(tmp_path / "run")],
                             capture_output=True, text=True, env=project_env, timeout=60)
    assert resumed.returncode == 2 and "--trust-code" in resumed.stderr
