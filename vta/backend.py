"""Backends: peers that run a :class:`~vta.program.Program` behind one small interface.

``get_backend("fsim")`` is the functional simulator (the spec); ``get_backend("tsim")`` the Verilator RTL
co-simulation (imported lazily from ``vta.tsim.backend``, so importing this module loads no shared library). Every
backend returns a :class:`RunResult` with the final DRAM image, so results compare bit for bit::

    ref = get_backend("fsim").run(program)
    rtl = get_backend("tsim").run(program)
    assert np.array_equal(ref.dram, rtl.dram)
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .program import Program

__all__ = ["RunResult", "Backend", "FsimBackend", "get_backend", "available_backends", "register_backend"]


@dataclass
class RunResult:
    """What a backend returns.

    backend: the backend's name. dram: final DRAM image (``uint8``, same size as ``program.dram``; the backend's own
    copy). stats: event counts (bytes moved, micro-ops, instructions; see :class:`vta.fsim.Stats`). cycles: clock
    cycles from start to done (None for untimed backends). counters: the hardware performance counters
    (``vta.hw.regs.COUNTERS``) when the backend has them, else None.
    """

    backend: str
    dram: np.ndarray
    stats: dict[str, int]
    cycles: int | None = None
    counters: dict[str, int] | None = None

    def read(self, program: Program, name: str) -> np.ndarray:
        """Allocation ``name`` of ``program`` from this run's final DRAM image."""
        return program.read(name, self.dram)


class Backend(ABC):
    """A way to run programs. Subclasses set ``name`` and implement :meth:`run`."""

    name: str = ""

    @abstractmethod
    def run(self, program: Program, **options: Any) -> RunResult:
        """Run ``program`` to FINISH and return its final DRAM image and statistics."""


class FsimBackend(Backend):
    """The functional simulator (:mod:`vta.fsim`): exact results and event counts, no cycles.

    Options (to the constructor or to :meth:`run`): ``max_insns`` (int or None): raise
    :class:`vta.fsim.RunawayError` past that many instructions; ``check_races`` (bool, default True): raise
    :class:`vta.fsim.RaceError` for data accesses of two modules that no dependency token orders.
    """

    name = "fsim"
    OPTIONS = ("max_insns", "check_races")

    def __init__(self, *, max_insns: int | None = None, check_races: bool = True) -> None:
        self.max_insns = max_insns
        self.check_races = check_races

    def run(self, program: Program, **options: Any) -> RunResult:
        from . import fsim

        unknown = set(options) - set(self.OPTIONS)
        if unknown:
            raise TypeError(f"the fsim backend takes only the options {', '.join(self.OPTIONS)}, not "
                            f"{', '.join(sorted(unknown))}")
        result = fsim.run(program, max_insns=options.get("max_insns", self.max_insns),
                          check_races=options.get("check_races", self.check_races))
        return RunResult(self.name, result.dram, result.stats.as_dict(), None, None)


def _tsim_factory(**options: Any) -> Backend:
    module = importlib.import_module("vta.tsim.backend")
    return module.TSimBackend(**options)


_FACTORIES: dict[str, Callable[..., Backend]] = {"fsim": FsimBackend, "tsim": _tsim_factory}


def register_backend(name: str, factory: Callable[..., Backend]) -> None:
    """Make ``get_backend(name, **options)`` call ``factory(**options)`` (e.g. for the cpu/gpu fallbacks)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"a backend name must be a non-empty string, not {name!r}")
    if not callable(factory):
        raise TypeError(f"a backend factory must be callable, not {factory!r}")
    _FACTORIES[name] = factory


def available_backends() -> list[str]:
    """Names accepted by :func:`get_backend`, sorted."""
    return sorted(_FACTORIES)


def get_backend(name: str, **options: Any) -> Backend:
    """The backend called ``name`` ('fsim', 'tsim', ...), constructed with ``options``."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown backend {name!r}; known backends are {', '.join(available_backends())}")
    return _FACTORIES[name](**options)
