"""Run a check that compiles nothing without importing torch's compiler.

torch marks many of its own functions to be skipped by its compiler (an optimizer's
`add_param_group`, the meta kernels that give a model's shapes without its memory), and the mark
imports the compiler, over a second on a commodity core, the first time such a function runs.
A launcher only checks a job before its workers start; every job would pay that second for
nothing. While a check runs, a stand-in answers for the compiler's `disable`; afterwards each
marked function is as it was, and a later call imports the real compiler as usual.
"""

from __future__ import annotations

import contextlib
import sys
import types

COMPILER = "torch._dynamo"
CACHED = "__dynamo_disable"  # where torch's mark keeps what the compiler's `disable` gave it


class CompilerNeeded(ImportError):
    """torch asked the stand-in for more than `disable`: the work runs again with the real compiler."""


def without_compiler(work):
    """`work()`, the compiler left unimported where torch only marks functions; run again with the real
    compiler where torch needs more of it (the work must be a check that can run twice)."""
    if COMPILER in sys.modules:
        return work()
    try:
        with _stand_in():
            return work()
    except CompilerNeeded:  # an attribute, or a submodule (its import asks the stand-in for `__path__`)
        return work()


@contextlib.contextmanager
def _stand_in():
    marked = []

    def disable(function, recursive=True, wrapping=True):
        marked.append(function)
        return function

    def anything_else(name: str):
        raise CompilerNeeded(f"{COMPILER}.{name}")

    stand_in = types.ModuleType(COMPILER)
    stand_in.disable = disable
    stand_in.__getattr__ = anything_else
    sys.modules[COMPILER] = stand_in
    try:
        yield
    finally:
        if sys.modules.get(COMPILER) is stand_in:
            del sys.modules[COMPILER]
        for function in marked:
            if getattr(function, CACHED, None) is function:
                delattr(function, CACHED)
