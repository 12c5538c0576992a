"""Backends: peers behind one small interface, found through one registry.

A backend does one or both of two kinds of work:

* it runs accelerator programs (:class:`~vta.program.Program`) with :meth:`Backend.run` and returns a
  :class:`RunResult`: ``fsim`` (the functional simulator, the spec) and ``tsim`` (the Verilator RTL co-simulation);
* it runs graph operators the accelerator does not run (a fallback) with :meth:`Backend.run_node`: ``cpu`` (the
  compiler's llvmlite kernels).

:data:`BACKENDS` is the one table of backends. It names each backend's class by module path and imports it on first
use, so importing this module loads no simulator, compiler or shared library, and this ground-floor module imports
nothing from the floors above (``vta.tsim``, ``vta.compiler``). Every program backend returns the final DRAM image,
so results compare bit for bit::

    ref = get_backend("fsim").run(program)
    rtl = get_backend("tsim").run(program)
    assert np.array_equal(ref.dram, rtl.dram)
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np

from .program import Program

__all__ = ["RunResult", "Backend", "BackendInfo", "UnsupportedWorkError", "BACKENDS", "get_backend", "backend_info",
           "available_backends", "program_backends", "operator_backends", "register_backend", "unregister_backend"]


@dataclass
class RunResult:
    """What a program backend returns.

    backend: the backend's name. dram: final DRAM image (``uint8``, same size as ``program.dram``; the backend's own
    copy). stats: event counts (bytes moved, micro-ops, instructions; see :mod:`vta.counters`). cycles: clock
    cycles from start to done (None for untimed backends). counters: the hardware performance counters
    (:data:`vta.counters.CSR_COUNTERS`) when the backend has them, else None.
    """

    backend: str
    dram: np.ndarray
    stats: dict[str, int]
    cycles: int | None = None
    counters: dict[str, int] | None = None

    def read(self, program: Program, name: str) -> np.ndarray:
        """Allocation ``name`` of ``program`` from this run's final DRAM image."""
        return program.read(name, self.dram)


class UnsupportedWorkError(ValueError):
    """A backend was asked for work of a kind it does not do (a program on an operator backend, or the reverse)."""


class Backend:
    """A way to run work. Subclasses set ``name``, the two ``runs_*`` flags and implement the matching method."""

    name: str = ""
    runs_programs: ClassVar[bool] = True
    """Whether :meth:`run` executes accelerator programs."""
    runs_operators: ClassVar[bool] = False
    """Whether :meth:`run_node` executes graph operators (a fallback for what the accelerator does not run)."""

    def run(self, program: Program, **options: Any) -> RunResult:
        """Run ``program`` to FINISH and return its final DRAM image and statistics."""
        raise UnsupportedWorkError(f"the {self.name} backend runs graph operators, not accelerator programs; "
                                   f"program backends are {', '.join(program_backends())}")

    def run_node(self, graph: Any, node: Any, values: Mapping[str, np.ndarray]) -> np.ndarray:
        """Execute one quantized graph node (a :class:`vta.compiler.ir.Node` of ``graph``) on its NCHW input arrays
        ``values`` (by tensor name, constants excluded) and return its output array, bit-exact with
        :func:`vta.compiler.qops.run_node`."""
        raise UnsupportedWorkError(f"the {self.name} backend runs accelerator programs, not graph operators; "
                                   f"operator backends are {', '.join(operator_backends())}")


@dataclass(frozen=True)
class BackendInfo:
    """One row of the registry.

    name: what ``--target`` and :func:`get_backend` take. factory: ``"module:attribute"`` of the backend class
    (imported on first use) or a callable ``factory(**options) -> Backend``. summary: one line for ``--help``.
    runs_programs / runs_operators: the kinds of work (see :class:`Backend`).
    """

    name: str
    factory: str | Callable[..., Backend]
    summary: str
    runs_programs: bool
    runs_operators: bool

    def load(self) -> Callable[..., Backend]:
        """The factory, importing its module if it is named by path."""
        if callable(self.factory):
            return self.factory
        module, _, attribute = self.factory.partition(":")
        return getattr(importlib.import_module(module), attribute)


BACKENDS: dict[str, BackendInfo] = {info.name: info for info in (
    BackendInfo("fsim", "vta.fsim_backend:FsimBackend", "functional simulator, the spec (exact results, event "
                "counts, no cycles)", runs_programs=True, runs_operators=False),
    BackendInfo("tsim", "vta.tsim.backend:TSimBackend", "Verilator co-simulation of the generated RTL "
                "(cycle-exact, hardware counters)", runs_programs=True, runs_operators=False),
    BackendInfo("cpu", "vta.compiler.kernels.cpu_backend:CpuBackend", "the compiler's llvmlite CPU kernels (runs whole "
                "models; no accelerator programs)", runs_programs=False, runs_operators=True),
    BackendInfo("gpu", "vta.compiler.kernels.gpu_backend:GpuBackend", "the compiler's GPU kernels on a CUDA device "
                "(emulate=True: in the SIMT emulator on the CPU; no accelerator programs)", runs_programs=False,
                runs_operators=True),
)}
"""Every backend by name, in the order ``--help`` lists them."""

_BUILTIN = frozenset(BACKENDS)


def register_backend(name: str, factory: Callable[..., Backend], *, summary: str = "", runs_programs: bool = True,
                     runs_operators: bool = False) -> None:
    """Make ``get_backend(name, **options)`` call ``factory(**options)`` (e.g. a stand-in core in a test)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"a backend name must be a non-empty string, not {name!r}")
    if not callable(factory):
        raise TypeError(f"a backend factory must be callable, not {factory!r}")
    if name in _BUILTIN:
        raise ValueError(f"{name!r} is a built-in backend and cannot be replaced; choose another name")
    BACKENDS[name] = BackendInfo(name, factory, summary, runs_programs, runs_operators)


def unregister_backend(name: str) -> None:
    """Remove a backend added by :func:`register_backend` (built-in ones stay)."""
    if name in _BUILTIN:
        raise ValueError(f"{name!r} is a built-in backend and cannot be removed")
    BACKENDS.pop(name, None)


def available_backends() -> list[str]:
    """Names accepted by :func:`get_backend`, sorted."""
    return sorted(BACKENDS)


def program_backends() -> list[str]:
    """Names of the backends that run accelerator programs, sorted."""
    return sorted(name for name, info in BACKENDS.items() if info.runs_programs)


def operator_backends() -> list[str]:
    """Names of the backends that run graph operators (fallbacks), sorted."""
    return sorted(name for name, info in BACKENDS.items() if info.runs_operators)


def backend_info(name: str) -> BackendInfo:
    """The registry row of ``name``; ``ValueError`` naming the known backends when there is none."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known backends are {', '.join(available_backends())}")
    return BACKENDS[name]


def get_backend(name: str, **options: Any) -> Backend:
    """The backend called ``name`` ('fsim', 'tsim', 'cpu', ...), constructed with ``options``."""
    return backend_info(name).load()(**options)
