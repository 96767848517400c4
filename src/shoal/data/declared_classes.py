"""The labels a user declares allowed on import, and the check that every row keeps to them.

A label outside the declared classes (a typo, a stray header, a class the model was not built
for) would otherwise silently become one more class. Classes are given as text, as on the
command line, and compared with labels of the source's own type: `1` matches an integer label
1, `cat` a text label "cat".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from shoal.errors import DataError


class DeclaredClasses:
    """The allowed labels; `check` raises `DataError` naming the first row whose label is not one."""

    def __init__(self, classes: Sequence[str]):
        self.text = [str(item).strip() for item in classes]
        if not self.text or "" in self.text:
            raise DataError(f"classes: expected a list of labels, got {list(classes)!r}")
        self._allowed: dict[str, np.ndarray] = {}

    def __str__(self) -> str:
        return ", ".join(self.text)

    def allowed(self, kind: str) -> np.ndarray:
        """The declared classes that read as labels of NumPy kind `kind` ('i' integers, 'f' floats, else text)."""
        if kind not in self._allowed:
            parse = int if kind == "i" else float if kind == "f" else str
            values = []
            for item in self.text:
                try:
                    values.append(parse(item.removeprefix("+")) if parse is not str else item)
                except ValueError:
                    continue  # a text class can never match a number label: such a row fails the check
            dtype = np.int64 if kind == "i" else np.float64 if kind == "f" else str
            self._allowed[kind] = np.array(values, dtype=dtype)
        return self._allowed[kind]

    def check(self, labels: np.ndarray, first_row: int, locate: Callable[[int], str]) -> None:
        """Raise for the first label outside the classes; `locate(row)` names the row for the message."""
        labels = np.asarray(labels).reshape(-1)
        kind = "i" if labels.dtype.kind in "iub" else "f" if labels.dtype.kind == "f" else "U"
        if kind == "U":
            labels = np.char.strip(labels.astype(str))
        bad = ~np.isin(labels, self.allowed(kind))
        if bad.any():
            index = int(np.flatnonzero(bad)[0])
            label = labels[index].item()
            raise DataError(f"{locate(first_row + index)}: label {label!r} is not one of the declared classes {self}")
