"""A user's own code that fails, sent to the workers by value as shoal.fit sends it: its tracebacks must name
this file and its lines (tests/unit/test_user_traceback.py), whatever shape the failing code has."""

from __future__ import annotations

import dataclasses
import functools

exec("def made_by_exec():\n    raise ValueError('made by exec')\n")  # code not from this file's lines


def step(model, batch):
    """A step whose error is raised two calls down, in a nested function and a method."""

    def nested(value):
        return Raiser().method(value)

    return nested(batch)


class Raiser:
    def method(self, value):
        return fail(value)


def fail(value):
    raise ValueError(f"my step is broken at {value}")


def decorator(function):
    @functools.wraps(function)
    def wrapper(*arguments):
        return function(*arguments)

    return wrapper


@decorator
def decorated(model, batch):
    return fail(batch)


lambda_step = lambda model, batch: fail(batch)  # noqa: E731 - a lambda is what is being tested


@dataclasses.dataclass
class Settings:
    """A dataclass: its __init__ is made by exec, not written in this file."""

    size: int


def uses_exec_made(model, batch):
    return made_by_exec()  # noqa: F821 - defined by the exec above
