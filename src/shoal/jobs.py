"""Reading a job: the sections typed and checked by `config`, the algorithm's options by the registry.

`config` knows the job's sections and nothing about algorithms; the options of `[algorithm]`
belong to the algorithm named there, so reading a whole job joins the two here, above both.
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path

from shoal.algorithms import option_names, options_class, refused_elsewhere
from shoal.config import (
    AlgorithmConfig,
    JobConfig,
    apply_overrides,
    build_section,
    drop_none,
    section_fields,
    unknown_key,
)
from shoal.errors import ConfigError


def from_dict(raw: dict, name: str = "job") -> JobConfig:
    """Build and validate a job from plain data (the parsed TOML)."""
    raw = dict(raw)
    algorithm_table = raw.pop("algorithm", {})
    if not isinstance(algorithm_table, dict):
        raise ConfigError(f"algorithm: must be a table such as {{ name = \"sync\" }}, got {algorithm_table!r}")
    algorithm_table = dict(algorithm_table)
    name = raw.pop("name", name)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"name: must be a non-empty string, got {name!r}")
    sections = section_fields()
    for key in raw:
        if key not in sections:
            raise unknown_key(key, [*sections, "algorithm"])
    for required in ("model", "data"):
        if required not in raw:
            raise ConfigError(f"{required}: required section is missing")
    job = build_section(JobConfig, raw, "")
    algorithm_name = algorithm_table.pop("name", "sync")
    if not isinstance(algorithm_name, str):
        raise ConfigError(f"algorithm.name: expected a string, got {algorithm_name!r}")
    options_type = options_class(algorithm_name)
    # Keys of another algorithm are set aside, so `--set algorithm.name=sync` works on a job written
    # for averaging; a key no algorithm knows is still an error, and so is one whose absence would train
    # another job than the file asks for (refused_elsewhere).
    own = {f.name for f in dataclasses.fields(options_type)}
    known, refused = option_names(), refused_elsewhere()
    for key in algorithm_table:
        if key not in known:
            raise unknown_key(f"algorithm.{key}", known | {"name"})
        if key not in own and key in refused:
            raise ConfigError(f"algorithm.{key}: {refused[key]}, not of {algorithm_name!r}; remove it, or choose "
                              "an algorithm that has it")
    options = build_section(options_type, {k: v for k, v in algorithm_table.items() if k in own}, "algorithm.")
    job.algorithm = AlgorithmConfig(name=algorithm_name, options=drop_none(dataclasses.asdict(options)))
    job.name = name
    return job


def load_job(path: str | Path, overrides: typing.Iterable[str] = ()) -> JobConfig:
    """Read a TOML job file, apply overrides, validate; errors name the file and key."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: job file not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read job file: {error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML: {error}") from None
    overrides = list(overrides)
    raw = apply_overrides(raw, overrides)
    try:
        job = from_dict(raw, name=path.stem)
    except ConfigError as error:
        raise ConfigError(f"{blamed_override(str(error), overrides) or path}: {error}") from None
    _resolve_paths(job, path.parent)
    return job


def blamed_override(message: str, overrides: list[str]) -> str | None:
    """`--set 'KEY=VALUE'` when the error `message` is about a key one of `overrides` set (not the job file's)."""
    for text in reversed(overrides):  # the last one given wins, as in apply_overrides
        key = text.split("=", 1)[0].strip()
        if message.startswith((f"{key}:", f"{key}.")):
            return f"--set {text!r}"
    return None


def _resolve_paths(job: JobConfig, base: Path) -> None:
    """Dataset paths in a job file are relative to the current directory, else to the file."""
    for key in ("train", "test"):
        value = getattr(job.data, key)
        if value and "://" not in value and not Path(value).is_absolute() and not Path(value).exists():
            candidate = base / value
            if candidate.exists():
                setattr(job.data, key, str(candidate))
