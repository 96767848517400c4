"""An Accelerate training script on the digits, ported to shoal: the same step, transform and scheduler.

    .venv/bin/python examples/accelerate_port.py            # 2 workers on this machine
    .venv/bin/python examples/accelerate_port.py --rows 6000 --workers 2 --epochs 2

The script as an Accelerate user writes it (the loop is theirs; Accelerate wraps the pieces):

    accelerator = Accelerator()
    model, optimizer = Net(), torch.optim.AdamW(Net().parameters(), lr=3e-3, weight_decay=1e-4)
    scheduler = warm_up_then_cosine(optimizer, total=epochs * len(loader))
    loader = DataLoader(TensorDataset(images, labels), batch_size=128, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for epoch in range(epochs):
        for batch in loader:
            loss = training_step(model, shift(batch))["loss"]
            accelerator.backward(loss)
            optimizer.step(); scheduler.step(); optimizer.zero_grad()

In shoal the loop is shoal's: it shards the rows over the workers once, exchanges gradients
(`algorithm="sync"`: DDP's all-reduce), checkpoints every epoch and evaluates on the test set.
The user's pieces keep their shape: `training_step(model, batch)` returns the loss (and numbers to
log), `shift(batch)` is the random augmentation, run on every batch of every epoch on its worker
(seeded, so a restarted job draws the same), and `warm_up_then_cosine(optimizer)` builds the
scheduler from shoal's optimizer. The functions travel to the workers by value.
"""

from __future__ import annotations

import argparse
import functools
import math
from pathlib import Path

import torch
from torch import nn

import shoal
from shoal.data.synthetic import synth_digits

BATCH = 128  # rows per worker per step, as Accelerate's per-device batch


class Net(nn.Module):
    """A small convolutional network for 28x28 digits."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 5), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.Flatten())
        self.classify = nn.Sequential(nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, images):
        return self.classify(self.features(images.reshape(-1, 1, 28, 28)))


def training_step(model, batch):
    """Cross-entropy with label smoothing, and the batch's accuracy to log."""
    images, labels = batch
    logits = model(images)
    loss = nn.functional.cross_entropy(logits, labels, label_smoothing=0.05)
    return {"loss": loss, "accuracy": (logits.argmax(dim=1) == labels).float().mean()}


def shift(batch):
    """Random augmentation: each image moved by up to two pixels, and a little noise."""
    images, labels = batch
    images = images.reshape(-1, 28, 28)
    dx, dy = (int(value) for value in torch.randint(-2, 3, (2,)))
    images = torch.roll(images, shifts=(dy, dx), dims=(1, 2))
    images = (images + 0.05 * torch.randn_like(images)).clamp(0, 1)
    return images.reshape(len(labels), -1), labels


def warm_up_then_cosine(optimizer, total: int, warm_up: int = 20):
    """A linear warm-up, then a cosine decay to zero at the last of `total` steps: two schedulers, which a job
    file's scheduler name cannot say."""
    warm_up = min(warm_up, total // 2)
    warm = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=warm_up)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(total - warm_up, 1))
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, cosine], milestones=[warm_up])


def digits(folder: Path, rows: int) -> tuple[Path, Path]:
    """Synthetic MNIST-shaped digits (shoal data synth digits), written once."""
    for name, count, seed in (("train", rows, 1), ("test", max(rows // 10, 500), 2)):
        if not (folder / name / "meta.json").exists():
            synth_digits(str(folder / name), count, seed=seed)
    return folder / "train", folder / "test"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("data/digits-small"))
    parser.add_argument("--run-dir", type=Path, default=None)
    args = parser.parse_args()
    train, test = digits(args.data, args.rows)
    steps = args.epochs * math.ceil(args.rows / args.workers / BATCH)  # each worker's optimizer steps
    result = shoal.fit(
        model=Net(), train=train, test=test, workers=args.workers, epochs=args.epochs, batch_size=BATCH,
        algorithm="sync", optimizer={"name": "adamw", "lr": 3e-3, "weight_decay": 1e-4},
        step=training_step, transform=shift,
        # stepped after every optimizer step; the steps it spans as the workers take them
        scheduler={"factory": functools.partial(warm_up_then_cosine, total=steps), "interval": "step"},
        run_dir=args.run_dir)
    for epoch in result.epochs:
        print(f"epoch {epoch.epoch}: train loss {epoch.train_loss:.3f}, batch accuracy "
              f"{epoch.train_metrics['accuracy']:.3f}, test accuracy {epoch.test.get('accuracy', float('nan')):.3f}")
    print("final:", result.metrics, "run directory:", result.run_dir)


if __name__ == "__main__":
    main()
