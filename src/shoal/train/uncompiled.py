"""Leave torch's compiler unimported until something compiles.

torch marks many of its own functions to be skipped by its compiler (an optimizer's
`add_param_group` and `zero_grad`, the meta kernels that give a model's shapes without its
memory), and every optimizer step asks the compiler for a graph break; the first of either
imports the compiler, about 1.5 s of a commodity core, in every process. shoal compiles nothing,
so a worker (for its life) and a launcher's checks (while they run) put a stand-in in its place.
The stand-in hands torch's own marks back unchanged and ignores graph breaks: what the real
compiler does outside a compilation. Anything else (torch.compile, a user's
`torch.compiler.disable`, one of its submodules) imports the real compiler there and then, and
the marks handed out are cleared, so that torch marks those functions again with it.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types

import torch

COMPILER = "torch._dynamo"
CACHED = "__dynamo_disable"  # where torch's mark keeps what the compiler's `disable` gave it


def defer_compiler() -> None:
    """For the rest of the process: torch's compiler is imported only when something needs more than its marks."""
    if COMPILER not in sys.modules:
        DeferredCompiler().install()


def without_compiler(work):
    """`work()`, the compiler left unimported where torch only marks functions; afterwards every function is
    as it was (a later call imports the real compiler as usual, unless the process defers it)."""
    if COMPILER in sys.modules:  # the real one, or the process's own stand-in
        return work()
    stand_in = DeferredCompiler()
    stand_in.install()
    try:
        return work()
    finally:
        stand_in.retire()


class _NothingCached:
    """The compiler's tracing rules while it is unimported: it has cached none."""

    @staticmethod
    def clear_lru_cache() -> None:
        pass


class DeferredCompiler(types.ModuleType):
    """Stands in `sys.modules` for torch's compiler until something needs the real one."""

    def __init__(self):
        super().__init__(COMPILER)
        self._deferring = True
        self._real = None
        self._marked: list = []
        self._lock = threading.RLock()

    def disable(self, fn=None, recursive=True, *, wrapping=True, **options):
        """torch's own mark of one of its functions (`wrapping=False`) gives the function unchanged."""
        if fn is not None and not wrapping and not options:
            with self._lock:
                if self._deferring:
                    self._marked.append(fn)
                    return fn
        return self.real().disable(fn, recursive, wrapping=wrapping, **options)

    def graph_break(self, *args, **kwargs):
        """Outside a compilation a graph break does nothing, and nothing compiles before the real compiler."""
        if self._real is not None:
            return self._real.graph_break(*args, **kwargs)
        return None

    @property
    def trace_rules(self):
        # torch.distributed clears the rules' caches when a process group starts, if the compiler is imported
        return self._real.trace_rules if self._real is not None else _NothingCached

    def __getattr__(self, name: str):
        if name.startswith("__") and name != "__path__":  # a look over sys.modules (inspect, pickle) is no need
            raise AttributeError(name)
        return getattr(self.real(), name)  # __path__: a submodule's import

    def install(self) -> None:
        sys.modules[COMPILER] = self
        # an attribute of torch too: each optimizer step looks it up twice, and torch's lazy lookup costs 3 us
        torch._dynamo = self

    def real(self) -> types.ModuleType:
        """The real compiler, imported in this stand-in's place the first time it is asked for."""
        with self._lock:
            if self._real is None:
                self._withdraw()
                self._real = importlib.import_module(COMPILER)
            return self._real

    def retire(self) -> None:
        """Leave sys.modules and clear the marks handed out; from now on every question goes to the real one."""
        with self._lock:
            self._withdraw()

    def _withdraw(self) -> None:
        self._deferring = False
        if sys.modules.get(COMPILER) is self:
            del sys.modules[COMPILER]
        if vars(torch).get("_dynamo") is self:
            del torch._dynamo
        for function in self._marked:
            if getattr(function, CACHED, None) is function:
                delattr(function, CACHED)
        self._marked.clear()
