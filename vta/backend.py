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
import json
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

import numpy as np

from .clock import design_clock
from .program import Program

__all__ = ["RunResult", "Backend", "BackendInfo", "UnsupportedWorkError", "BACKENDS", "get_backend", "backend_info",
           "available_backends", "program_backends", "operator_backends", "register_backend", "unregister_backend",
           "unavailable_reason", "FALLBACKS", "FallbackChoice", "FallbackError", "choose_fallback", "RunSummary"]


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


@dataclass
class RunSummary:
    """One run of one accelerator program (or of the GEMM benchmark) on a backend: what ``vta run PROGRAM.npz
    --json`` and ``vta tsim run PROGRAM --json`` print, the same keys from both (:meth:`to_dict`).

    workload: what ran (``program FILE``, ``gemm MxKxN``). backend: the backend's name. config: the config's
    canonical name. instructions: the program's instructions (None for an operator backend). cycles: clock cycles
    (None for untimed backends). correct: the result against a reference (the GEMM benchmark's numpy product; None:
    not checked). summary: derived figures (:meth:`derived`: ``useful_macs``, ``macs_issued``, ``mac_utilization``,
    ``time_us`` at the design's clock, ``clock_mhz``, ``clock_source``). stats: the backend's event counts
    (:mod:`vta.counters`). counters: the hardware performance counters ({} without them). layer: the accelerator
    layer of a compiled model (``.vtac``) that ran, else None. trace: the waveform written, else None. check: the
    comparison with fsim (``{"dram": "equal", "counters_differing": {}}`` when made; ``"none"`` when not).
    """

    workload: str
    backend: str
    config: str
    instructions: int | None
    cycles: int | None
    correct: bool | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    layer: str | None = None
    trace: str | None = None
    check: dict[str, Any] | str = "none"

    @classmethod
    def of(cls, workload: str, program: Program, result: RunResult, *, useful_macs: int | None = None,
           clock_mhz: float | None = None, **fields: Any) -> "RunSummary":
        """The summary of ``result``, a run of ``program``, its time at ``clock_mhz`` (the user's clock, e.g.
        ``--clock-mhz``; None: the design's clock); ``fields``: the other fields (correct, layer, ...)."""
        return cls(workload, result.backend, program.cfg.name, len(program.insns), result.cycles,
                   summary=cls.derived(program.cfg, useful_macs, result, clock_mhz), stats=dict(result.stats),
                   counters=dict(result.counters or {}), **fields)

    @staticmethod
    def derived(cfg: Any, useful_macs: int | None, result: RunResult,
                clock_mhz: float | None = None) -> dict[str, Any]:
        """Figures derived from a run: MACs, and with cycles the MAC utilization and the time (``time_us``) at
        ``clock_mhz`` when given (the user's, MHz), else at the design's clock (``clock_mhz``, from
        ``clock_source``: :func:`vta.clock.design_clock`).

        ``useful_macs`` (the workload's own m*k*n, None when unknown) excludes the zero padding of partial blocks;
        without it the utilization counts every MAC the GEMM core issued (``gemm_uops`` x MACs per micro-op, resets
        included).
        """
        out: dict[str, Any] = {}
        if useful_macs is not None:
            out["useful_macs"] = useful_macs
        macs = result.stats.get("macs")
        if macs is not None:
            out["macs_issued"] = int(macs)  # includes the zero padding of partial blocks
        if result.cycles:
            work = useful_macs if useful_macs is not None else \
                int(result.stats.get("gemm_uops", 0)) * cfg.macs_per_cycle
            out["mac_utilization"] = round(work / (result.cycles * cfg.macs_per_cycle), 4)
            clock = design_clock(cfg, clock_mhz)
            out["time_us"] = round(result.cycles / clock.mhz, 3)
            out["clock_mhz"], out["clock_source"] = clock.mhz, clock.source
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, in field order (plain Python values)."""
        return {"workload": self.workload, "backend": self.backend, "config": self.config,
                "instructions": self.instructions, "cycles": self.cycles, "correct": self.correct,
                "summary": dict(self.summary), "stats": dict(self.stats), "counters": dict(self.counters),
                "layer": self.layer, "trace": self.trace, "check": self.check}

    def to_json(self, indent: int = 2) -> str:
        """:meth:`to_dict` as JSON (numpy scalars as numbers)."""
        return json.dumps(self.to_dict(), indent=indent, default=_json_default)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


class UnsupportedWorkError(ValueError):
    """A backend was asked for work of a kind it does not do (a program on an operator backend, or the reverse)."""


class Backend:
    """A way to run work. Subclasses set ``name``, the two ``runs_*`` flags and implement the matching method."""

    name: str = ""
    runs_programs: ClassVar[bool] = True
    """Whether :meth:`run` executes accelerator programs."""
    runs_operators: ClassVar[bool] = False
    """Whether :meth:`run_node` executes graph operators (a fallback for what the accelerator does not run)."""

    def prepare(self, cfg: Any) -> None:
        """Get ready to run programs of ``cfg`` (a :class:`vta.config.VTAConfig`): what a backend does once before
        its first program (tsim: build or load the simulator), so that a caller can time it apart. Default: nothing;
        :meth:`run` prepares on its own when not called."""

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
    runs_programs / runs_operators: the kinds of work (see :class:`Backend`). probe: ``"module:function"`` (or a
    callable) returning None when the backend can run on this machine, else a sentence saying why not (no probe:
    always available).
    """

    name: str
    factory: str | Callable[..., Backend]
    summary: str
    runs_programs: bool
    runs_operators: bool
    probe: str | Callable[[], str | None] | None = None

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
                "(--emulate-gpu: in the SIMT emulator on the CPU; no accelerator programs)", runs_programs=False,
                runs_operators=True, probe="vta.compiler.kernels.gpu_backend:device_reason"),
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


def unavailable_reason(name: str) -> str | None:
    """None when the backend ``name`` can run on this machine (its registry row's probe says so, or it has none),
    else the probe's sentence saying why not (e.g. ``"no CUDA device ..."``)."""
    probe = backend_info(name).probe
    if probe is None:
        return None
    if not callable(probe):
        module, _, attribute = probe.partition(":")
        probe = getattr(importlib.import_module(module), attribute)
    return probe()


FALLBACKS = ("cpu", "gpu", "auto")
"""Where a model's layers the accelerator does not run may go: ``cpu`` (the llvmlite kernels), ``gpu`` (the GPU
kernels on a CUDA device) or ``auto`` (gpu when a device is present, else cpu); see :func:`choose_fallback`."""


class FallbackError(ValueError):
    """A fallback choice that cannot be honoured (the GPU asked for without a device, an option that does not go with
    the target); the message names the command-line options, as ``vta run`` users give them."""


@dataclass(frozen=True)
class FallbackChoice:
    """Where a model's operators run, decided by :func:`choose_fallback`.

    fallback: the operator backend of the layers the accelerator does not run (a name, or a constructed backend),
    what :func:`vta.compiler.runtime.executor.run` takes. target_options: the target backend's options when the
    target itself runs operators (``--target gpu``), else None. note: where the operators run, a phrase for the run
    report (None for the plain cpu fallback).
    """

    fallback: str | Backend
    target_options: Mapping[str, Any] | None = None
    note: str | None = None


def choose_fallback(target: str, fallback: str = "cpu", *, emulate_gpu: bool = False) -> FallbackChoice:
    """Where a model run on ``target`` runs its other layers, for ``fallback`` (one of :data:`FALLBACKS`) and
    ``emulate_gpu`` (the GPU kernels in the SIMT emulator on the CPU), checked before any work: a
    :class:`FallbackError` when the choice does not go with the target or asks for the GPU where there is no CUDA
    device (without ``emulate_gpu``), saying where the work can run instead."""
    if fallback not in FALLBACKS:
        raise FallbackError(f"--fallback {fallback} is unknown; use one of {', '.join(FALLBACKS)}")
    if target != "gpu" and fallback == "cpu":
        if emulate_gpu:
            raise FallbackError("--emulate-gpu runs the GPU kernels in the SIMT emulator; it goes with --fallback gpu "
                                "or --target gpu, not with the cpu fallback")
        return FallbackChoice("cpu")
    if target != "gpu" and backend_info(target).runs_operators:
        raise FallbackError(f"--fallback {fallback} chooses where an accelerator target's other layers run "
                            f"({', '.join(program_backends())}); --target {target} runs every layer itself")
    reason = None if emulate_gpu else unavailable_reason("gpu")
    if fallback == "auto" and target != "gpu" and not emulate_gpu:
        return FallbackChoice("cpu", None, f"cpu (auto: {reason})") if reason else \
            FallbackChoice("gpu", None, "gpu (auto: a CUDA device)")
    option = "--target gpu" if target == "gpu" else "--fallback gpu"
    if reason:
        raise FallbackError(f"{option}: {reason}; nothing was run. Run the operators on the CPU instead (--fallback "
                            f"cpu or --target cpu), let --fallback auto choose (the GPU when one is present, else the "
                            f"CPU), or add --emulate-gpu to run the GPU kernels in the SIMT emulator on the CPU")
    where = "gpu kernels in the SIMT emulator on the CPU (--emulate-gpu)" if emulate_gpu else "gpu (a CUDA device)"
    if target == "gpu":
        return FallbackChoice("cpu", {"emulate": emulate_gpu}, where)
    return FallbackChoice(get_backend("gpu", emulate=True) if emulate_gpu else "gpu", None, where)
