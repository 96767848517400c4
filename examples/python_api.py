"""shoal's Python API on a user's own objects, cell by cell as a notebook would run it.

    .venv/bin/python examples/python_api.py

Each block is one job on a small two-class task: a module class defined right here with NumPy
arrays on 2 workers, a pandas DataFrame with a label column, a torch Dataset with a callback that
stops the job early, and the same model read back from its run directory.
"""

import numpy as np
import pandas as pd
import torch
from torch import nn

import shoal

# %% a two-class task: the sign of x0 * x1, with 20 features
generator = np.random.default_rng(0)
x = generator.normal(size=(20_000, 20)).astype("float32")
y = (x[:, 0] * x[:, 1] > 0).astype(int)
x_test, y_test = x[-4_000:], y[-4_000:]
x, y = x[:-4_000], y[:-4_000]


# %% a module class no other process could import: it travels to the workers by value
class Net(nn.Module):
    def __init__(self, width: int = 64):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(20, width), nn.ReLU(), nn.Linear(width, 2))

    def forward(self, inputs):
        return self.layers(inputs)


result = shoal.fit(model=Net(), train=(x, y), test=(x_test, y_test), workers=2, epochs=4, batch_size=128,
                   optimizer={"name": "adam", "lr": 0.003}, algorithm="sync")
print("arrays:", result.metrics)

# %% a DataFrame whose label column holds text; a callable builds the model in each worker
frame = pd.DataFrame(x, columns=[f"x{i}" for i in range(20)]).assign(outcome=np.where(y == 1, "same", "differ"))
test_frame = pd.DataFrame(x_test, columns=frame.columns[:-1]).assign(outcome=np.where(y_test == 1, "same", "differ"))
result = shoal.fit(model=lambda: Net(width=32), train=frame, test=test_frame, label="outcome", workers=2,
                   epochs=4, batch_size=128, optimizer={"name": "adam", "lr": 0.003})
print("DataFrame:", result.metrics)


# %% a torch Dataset, and a callback that ends the job once the test accuracy is good enough
class GoodEnough:
    def on_epoch_end(self, epoch, metrics):
        print(f"  callback: epoch {epoch + 1}, test accuracy {metrics.get('test_accuracy')}")
        return metrics.get("test_accuracy", 0) > 0.9


dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
result = shoal.fit(model=Net(), train=dataset, test=(x_test, y_test), workers=1, epochs=20, batch_size=128,
                   optimizer={"name": "adam", "lr": 0.003}, callbacks=[GoodEnough()])
print(f"Dataset: stopped after {len(result.epochs)} of 20 epochs:", result.metrics)

# %% the model from its run directory: a model sent by value is code, loaded only when trusted
model = shoal.load_model(result.run_dir, trust_code=True)
print("reloaded:", model(torch.from_numpy(x_test[:3])).argmax(dim=1).tolist(), "expected", y_test[:3].tolist())
