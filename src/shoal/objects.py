"""Python objects shipped to the workers by value: a user's model and callbacks from `shoal.fit`.

A class defined in a notebook or inside a function cannot be imported by another process, so a
`model.factory` cannot name it. cloudpickle writes such objects with their code, and every worker
reads the same file. Reading one runs that code: a file like this in a run directory is loaded
only when the user vouches for it (see `shoal.model.check_trusted`), as with a factory.
"""

from __future__ import annotations

import pickle
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

from shoal.durable import write_durably
from shoal.errors import ConfigError, first_line


def save_object(value: Any, path: str | Path, where: str) -> Path:
    """Write `value` with its code to `path`, whole or not at all; `where` names it in an error."""
    import cloudpickle

    path = Path(path)
    modules = users_modules(value)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:  # a new temporary with an unpredictable name; never through a link at `path`
        write_durably(path, lambda handle: cloudpickle.dump(value, handle))
    except ConfigError:
        raise
    except Exception as error:  # a lock, an open file, a generator: what pickling refuses
        raise ConfigError(f"{where}: cannot be sent to the workers: {type(error).__name__}: "
                          f"{first_line(error)}") from None
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)
    return path


def users_modules(value: Any) -> list[ModuleType]:
    """The user's own modules that define `value` (or the items of a list of it): sent with their code, since
    a worker may not find them (a script's folder, a test package, a notebook's helpers). Installed
    packages, the standard library and shoal itself are imported by name, as everywhere."""
    installed = {Path(folder).resolve() for folder in sysconfig.get_paths().values()}
    found = []
    for item in value if isinstance(value, list) else [value]:
        # a function's own module, or an object's class's
        for module_name in {type(item).__module__, getattr(item, "__module__", None)} - {None, "__main__", "builtins"}:
            module = sys.modules.get(module_name)
            file = getattr(module, "__file__", None)
            if (module is None or file is None or module_name.partition(".")[0] == "shoal"
                    or any(folder in Path(file).resolve().parents for folder in installed)):
                continue
            found.append(module)
    return list(dict.fromkeys(found))


def load_object(path: str | Path, where: str) -> Any:
    """The object in `path` (its code runs as it loads: call only for a file the user vouches for)."""
    try:
        with open(path, "rb") as handle:
            return pickle.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{where}: {path}: file not found") from None
    except Exception as error:  # a damaged file, or code that no longer loads (a module gone)
        raise ConfigError(f"{where}: {path}: cannot load: {type(error).__name__}: {first_line(error)}") from None
