"""Provider registry: a benchmark names its providers; each one knows whether it can run here.

A provider has a ``name``, ``available() -> (bool, reason)`` and
``prepare(M, N, K, rng, threads=1) -> Prepared``. :class:`Prepared` is callable (one GEMM call) and
may bring its own timer (tvm-lowprec uses TVM's ``time_evaluator``), a thread-limit context entered
around timing, and extra result columns such as ``max_diff_vs_ort``.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from typing import Callable, ClassVar, ContextManager, Mapping

import numpy as np

from .timing import Measurement, Timing


@dataclass(frozen=True)
class Prepared:
    """One provider, ready to run one benchmark point.

    Attributes
    ----------
    run : callable
        Zero-argument call computing the GEMM once.
    timer : callable or None
        ``timer(timing) -> Measurement`` replacing wall-clock timing of ``run``.
    timer_name : str
        Recorded in the results (``wall`` or the provider's own timer).
    context : callable
        Zero-argument factory of a context manager entered while timing (thread limits).
    extra : mapping
        Additional result columns, e.g. ``{"max_diff_vs_ort": 0}``.
    note : str
        Free text recorded with the point.
    """

    run: Callable[[], object]
    timer: Callable[[Timing], Measurement] | None = None
    timer_name: str = "wall"
    context: Callable[[], ContextManager] = contextlib.nullcontext
    extra: Mapping[str, object] = field(default_factory=dict)
    note: str = ""

    def __call__(self):
        return self.run()


class BaseProvider:
    """Shared behaviour: availability means every module in ``requires`` imports.

    Subclasses set ``name`` and ``requires`` and implement ``prepare``.
    """

    name: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()

    def available(self) -> tuple[bool, str]:
        """Return ``(True, "")`` or ``(False, reason)``."""
        for module in self.requires:
            try:
                importlib.import_module(module)
            except ImportError as err:
                return False, f"{module} not importable: {err}"
        return True, ""

    def errors(self) -> tuple[type[BaseException], ...]:
        """Library-specific exception types a point may raise (recorded, not propagated)."""
        return ()

    def prepare(self, m: int, n: int, k: int, rng: np.random.Generator, threads: int = 1) -> Prepared:
        raise NotImplementedError


PROVIDERS: dict[str, BaseProvider] = {}


def register(cls: type[BaseProvider]) -> type[BaseProvider]:
    """Class decorator: instantiate ``cls`` and add it to :data:`PROVIDERS` under ``cls.name``."""
    if not cls.name or cls.name in PROVIDERS:
        raise ValueError(f"provider name {cls.name!r} is empty or already registered")
    PROVIDERS[cls.name] = cls()
    return cls


def get_provider(name: str) -> BaseProvider:
    """Look a provider up by name; unknown names raise ``KeyError`` listing the known ones."""
    try:
        return PROVIDERS[name]
    except KeyError:
        raise KeyError(f"unknown provider {name!r}; known: {', '.join(PROVIDERS)}") from None
