"""Python objects shipped to the workers by value: a user's model and callbacks from `shoal.fit`.

A class defined in a notebook or inside a function cannot be imported by another process, so a
`model.factory` cannot name it. cloudpickle writes such objects with their code, and every worker
reads the same file. Reading one runs that code: a file like this in a run directory is loaded
only when the user vouches for it (see `shoal.model.check_trusted`), as with a factory.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from shoal.durable import replace_durably
from shoal.errors import ConfigError, first_line


def save_object(value: Any, path: str | Path, where: str) -> Path:
    """Write `value` with its code to `path`, whole or not at all; `where` names it in an error."""
    import cloudpickle

    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "wb") as handle:
            cloudpickle.dump(value, handle)
    except Exception as error:  # a lock, an open file, a generator: what pickling refuses
        temporary.unlink(missing_ok=True)
        raise ConfigError(f"{where}: cannot be sent to the workers: {type(error).__name__}: "
                          f"{first_line(error)}") from None
    replace_durably(temporary, path)
    return path


def load_object(path: str | Path, where: str) -> Any:
    """The object in `path` (its code runs as it loads: call only for a file the user vouches for)."""
    try:
        with open(path, "rb") as handle:
            return pickle.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{where}: {path}: file not found") from None
    except Exception as error:  # a damaged file, or code that no longer loads (a module gone)
        raise ConfigError(f"{where}: {path}: cannot load: {type(error).__name__}: {first_line(error)}") from None
