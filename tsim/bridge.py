"""Load a built TSIM library with ctypes and run programs on it: one call into C++ per run, never one per cycle.

The DRAM image is a numpy ``uint8`` array shared with the harness: the core reads and writes it in place (the array
must be C-contiguous and writeable; :meth:`Model.run` works on a copy unless ``in_place=True``). Stops other than
FINISH become exceptions: :class:`TsimMemoryError` (an access outside the image, naming the address),
:class:`TsimWatchdogError` (no progress: each module's state, the last instruction it took, the counters) and
:class:`TsimBudgetError` (the cycle budget ran out).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from vta.config import VTAConfig
from vta.counters import CSR_COUNTERS, CYCLE_CLASSES, MODULES

from .build import Build

__all__ = ["TsimError", "TsimMemoryError", "TsimWatchdogError", "TsimBudgetError", "Model", "RunOutput",
           "ModuleState", "load"]

_DONE, _BUDGET, _WATCHDOG, _MEM_ERROR, _BAD_ARGS = 0, 1, 2, 3, 4


class TsimError(RuntimeError):
    """A co-simulation run did not reach FINISH. ``counters`` holds the core's counters when it stopped."""

    def __init__(self, message: str, *, cycles: int, counters: Mapping[str, int]) -> None:
        super().__init__(message)
        self.cycles = cycles
        self.counters = dict(counters)


class TsimMemoryError(TsimError):
    """The core addressed memory outside the program's DRAM image (or misaligned): ``address`` (bytes), ``nbytes``,
    ``write`` (True for a write beat, False for a read request)."""

    def __init__(self, message: str, *, address: int, nbytes: int, write: bool, cycles: int,
                 counters: Mapping[str, int]) -> None:
        super().__init__(message, cycles=cycles, counters=counters)
        self.address = address
        self.nbytes = nbytes
        self.write = write


@dataclass(frozen=True)
class ModuleState:
    """What one module was doing when the watchdog fired: ``state`` is ``idle``, ``busy``, ``wait_token`` or
    ``wait_mem`` (its cycle class in the last cycle); ``insns_done`` counts the instructions it completed;
    ``last_insn`` describes the instruction it took last (the one it was working on), when known."""

    module: str
    state: str
    insns_done: int
    last_insn: str | None = None

    def __str__(self) -> str:
        text = f"{self.module}: {self.state}, {self.insns_done} instructions done"
        return text + (f", last took {self.last_insn}" if self.last_insn else "")


class TsimWatchdogError(TsimError):
    """No module made progress for ``idle_cycles`` cycles; ``modules`` lists each module's :class:`ModuleState`."""

    def __init__(self, message: str, *, modules: Sequence[ModuleState], idle_cycles: int, cycles: int,
                 counters: Mapping[str, int]) -> None:
        super().__init__(message, cycles=cycles, counters=counters)
        self.modules = tuple(modules)
        self.idle_cycles = idle_cycles


class TsimBudgetError(TsimError):
    """The run used its whole cycle budget without reaching FINISH."""


class _Info(ctypes.Structure):
    _fields_ = [("cycles", ctypes.c_uint64), ("idle_cycles", ctypes.c_uint64), ("err_addr", ctypes.c_uint64),
                ("err_bytes", ctypes.c_uint64), ("status", ctypes.c_int32), ("err_write", ctypes.c_int32),
                ("rd_requests", ctypes.c_uint64), ("rd_beats", ctypes.c_uint64), ("wr_beats", ctypes.c_uint64),
                ("done_cycle", ctypes.c_uint64)]


@dataclass
class RunOutput:
    """One finished run: ``cycles`` (harness cycles from start to done), ``counters`` (name -> value, the core's
    counters in :data:`vta.counters.CSR_COUNTERS` order), the host's view of the memory traffic (``rd_requests``,
    ``rd_beats``, ``wr_beats``) and ``drain_cycles``, the cycles clocked after done to let late work finish."""

    cycles: int
    counters: dict[str, int] = field(default_factory=dict)
    rd_requests: int = 0
    rd_beats: int = 0
    wr_beats: int = 0
    drain_cycles: int = 0


_P = ctypes.POINTER


class Model:
    """A loaded TSIM library for one config. Stateless between runs: every :meth:`run` starts a fresh core."""

    def __init__(self, build: Build) -> None:
        self.build = build
        self.cfg: VTAConfig = build.cfg
        self._lib = ctypes.CDLL(str(build.library))
        fn = self._lib.tsim_run
        fn.restype = ctypes.c_int32
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64,
                       ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, _P(ctypes.c_uint64), _P(ctypes.c_uint64),
                       ctypes.c_uint32,
                       ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, _P(_Info)]
        self._lib.tsim_bus_bytes.restype = ctypes.c_uint32
        self._lib.tsim_trace_kind.restype = ctypes.c_int32
        bus = self._lib.tsim_bus_bytes()
        if bus != self.cfg.bus_bytes:
            raise ValueError(f"the library {build.library} was built for a {bus}-byte bus, but config {self.cfg.name} "
                             f"has bus_bytes={self.cfg.bus_bytes}")

    def idle_cycles(self, cycles: int, *, two_phase: bool = False) -> None:
        """Clock an idle core (reset, never started) for ``cycles`` cycles: the bare model-evaluation cost, for
        benchmarks (compare its time per cycle with a real run's to see what the harness adds). ``two_phase`` as
        in :meth:`run`."""
        _check_uint("cycles", cycles, 64)
        fn = self._lib.tsim_idle_cycles
        fn.argtypes = [ctypes.c_uint64, ctypes.c_int32]
        fn.restype = None
        fn(cycles, int(bool(two_phase)))

    @property
    def one_eval(self) -> bool:
        """Whether the library evaluates the model once per cycle (else every run is two-phase)."""
        fn = self._lib.tsim_one_eval
        fn.restype = ctypes.c_int32
        return bool(fn())

    @property
    def trace_kind(self) -> str:
        """``none``, ``vcd`` or ``fst``: the waveform format this library can write."""
        return ("none", "vcd", "fst")[self._lib.tsim_trace_kind()]

    def run(self, dram: np.ndarray, *, insn_addr: int, insn_count: int, max_cycles: int = 0,
            watchdog_cycles: int = 10_000, latency: int | None = None, drain_cycles: int | None = None,
            trace: str | Path | None = None, trace_window: tuple[int, int] | None = None, in_place: bool = False,
            insns: Sequence[object] | None = None, two_phase: bool = False) -> tuple[np.ndarray, RunOutput]:
        """Run ``insn_count`` instructions at byte address ``insn_addr`` of the DRAM image ``dram`` (uint8, 1-D).

        ``max_cycles``: cycle budget (0: none). ``watchdog_cycles``: cycles without progress before stopping (0:
        off). ``latency``: read latency in cycles (default ``cfg.dram_latency``). ``drain_cycles``: after ``done``,
        keep clocking until nothing progresses for this many cycles (default ``4 * latency + 256``; 0: stop at done),
        so loads that FINISH did not wait for still show in the counters. ``trace``: waveform file to write
        for cycles ``trace_window = (first, end)`` (default all), needs a library built with trace support.
        ``insns``: the decoded instruction stream, used only to name the last instruction of each module when the
        watchdog fires. ``two_phase``: evaluate the model at both clock edges, the reference scheduling (slower; the
        default evaluates once per cycle, which gives the same results: see ``harness.cc``); a traced run is always
        two-phase, so the waveform shows both clock edges. Returns the final DRAM (``dram`` itself when ``in_place``,
        else a copy) and a :class:`RunOutput`; raises a :class:`TsimError` subclass when FINISH is not reached.
        """
        image = _check_dram(dram, in_place)
        _check_uint("insn_addr", insn_addr, 32)
        _check_uint("insn_count", insn_count, 32)
        _check_uint("max_cycles", max_cycles, 64)
        _check_uint("watchdog_cycles", watchdog_cycles, 64)
        latency = self.cfg.dram_latency if latency is None else latency
        _check_uint("latency", latency, 32)
        drain_cycles = 4 * latency + 256 if drain_cycles is None else drain_cycles
        _check_uint("drain_cycles", drain_cycles, 64)
        trace_arg, begin, end = self._trace_args(trace, trace_window)
        n = len(CSR_COUNTERS)
        counters = (ctypes.c_uint64 * n)()
        before = (ctypes.c_uint64 * n)()
        info = _Info()
        status = self._lib.tsim_run(image.ctypes.data, image.size, insn_addr, insn_count, max_cycles,
                                    watchdog_cycles, latency, drain_cycles, counters, before, n, trace_arg, begin,
                                    end, int(bool(two_phase)), ctypes.byref(info))
        values = dict(zip(CSR_COUNTERS, (int(v) for v in counters)))
        if status == _DONE:
            return image, RunOutput(int(info.done_cycle), values, int(info.rd_requests), int(info.rd_beats),
                                    int(info.wr_beats), int(info.cycles) - int(info.done_cycle))
        raise self._error(status, info, values, dict(zip(CSR_COUNTERS, (int(v) for v in before))), image.size, insns)

    def run_program(self, program: Any, **options: Any) -> tuple[np.ndarray, RunOutput]:
        """:meth:`run` on a :class:`vta.program.Program`: its DRAM image, instruction offset and instruction stream;
        ``options`` are :meth:`run`'s keyword arguments."""
        insns = list(program.insns)
        return self.run(np.asarray(program.dram, dtype=np.uint8), insn_addr=int(program.insn_offset),
                        insn_count=len(insns), insns=insns, **options)

    def _trace_args(self, trace: str | Path | None, window: tuple[int, int] | None) -> tuple[bytes | None, int, int]:
        if trace is None:
            if window is not None:
                raise ValueError("trace_window was given without trace=; name the waveform file to write")
            return None, 0, 0
        if self.trace_kind == "none":
            raise ValueError(f"the library {self.build.library} was built without trace support; build it with "
                             "trace='fst' or trace='vcd' to record waveforms")
        begin, end = window if window is not None else (0, 2**64 - 1)
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin < end):
            raise ValueError(f"trace_window must be (first, end) cycles with 0 <= first < end, not {window!r}")
        Path(trace).parent.mkdir(parents=True, exist_ok=True)
        return str(trace).encode(), begin, min(end, 2**64 - 1)

    def _error(self, status: int, info: _Info, values: dict[str, int], before: dict[str, int], size: int,
               insns: Sequence[object] | None) -> TsimError:
        cycles = int(info.cycles)
        if status == _MEM_ERROR:
            kind = "write" if info.err_write else "read"
            addr, nbytes = int(info.err_addr), int(info.err_bytes)
            if nbytes == 0:
                what = f"a zero-length {kind} request at byte address {addr:#x}"
            elif addr % self.cfg.bus_bytes:
                what = (f"a {kind} at byte address {addr:#x}, which is not a multiple of the "
                        f"{self.cfg.bus_bytes}-byte bus width")
            else:
                what = (f"a {kind} of {nbytes} bytes at byte address {addr:#x} (up to {addr + nbytes:#x}), "
                        f"outside the {size}-byte DRAM image")
            return TsimMemoryError(f"the core made {what} at cycle {cycles}; the run was stopped",
                                   address=addr, nbytes=nbytes, write=bool(info.err_write), cycles=cycles,
                                   counters=values)
        if status == _WATCHDOG:
            modules = module_states(values, before, insns)
            lines = "\n".join(f"  {m}" for m in modules)
            return TsimWatchdogError(f"no module made progress for {int(info.idle_cycles)} cycles (at cycle {cycles}); "
                                     f"the run was stopped:\n{lines}", modules=modules,
                                     idle_cycles=int(info.idle_cycles), cycles=cycles, counters=values)
        if status == _BUDGET:
            return TsimBudgetError(f"the run used its whole budget of {cycles} cycles without reaching FINISH "
                                   f"({values.get('fetch_insns', 0)} instructions fetched, "
                                   f"{values.get('compute_insns', 0)} computed); raise max_cycles if the program "
                                   "is simply long", cycles=cycles, counters=values)
        return TsimError(f"the harness rejected its arguments (status {status})", cycles=cycles, counters=values)


def module_states(after: Mapping[str, int], before: Mapping[str, int],
                  insns: Sequence[object] | None = None) -> list[ModuleState]:
    """Each module's state in the cycle between two counter snapshots, and the instruction it took last.

    The state is the cycle class whose counter grew (``idle`` when none did). The last instruction is looked up in
    ``insns`` (the program's decoded stream) by routing every instruction to its module as fetch does.
    """
    routed: dict[str, list[tuple[int, object]]] = {m: [] for m in MODULES}
    describe = _describer()
    if insns is not None:
        from vta.isa import module_of
        for k, insn in enumerate(insns):
            routed["fetch"].append((k, insn))
            routed[module_of(insn)].append((k, insn))  # type: ignore[arg-type]
    out = []
    for m in MODULES:
        grew = [c for c in CYCLE_CLASSES if after.get(f"{m}_{c}", 0) > before.get(f"{m}_{c}", 0)]
        state = grew[0] if grew else "idle"
        done = after.get(f"{m}_insns", 0)
        last = None
        if routed[m]:
            k = min(done - 1 if state == "idle" else done, len(routed[m]) - 1)
            if k >= 0:
                index, insn = routed[m][k]
                last = f"instruction {index} ({describe(insn)})"
        out.append(ModuleState(m, state, done, last))
    return out


def _describer() -> Callable[[object], str]:
    try:
        from vta.asm import format_insn
    except ImportError:  # the disassembler is optional here
        return repr
    return format_insn  # type: ignore[return-value]


def load(build: Build) -> Model:
    """A :class:`Model` for a :class:`~vta.tsim.build.Build`."""
    return Model(build)


def _check_dram(dram: np.ndarray, in_place: bool) -> np.ndarray:
    if not isinstance(dram, np.ndarray):
        raise TypeError(f"the DRAM image must be a numpy uint8 array, not {type(dram).__name__}")
    if dram.dtype != np.uint8 or dram.ndim != 1:
        raise TypeError(f"the DRAM image must be a 1-D uint8 array, not {dram.ndim}-D {dram.dtype}")
    if not in_place:
        return np.ascontiguousarray(dram).copy()
    if not (dram.flags.c_contiguous and dram.flags.writeable):
        raise ValueError("in_place=True needs a C-contiguous, writeable DRAM array; pass a copy or in_place=False")
    return dram


def _check_uint(name: str, value: int, bits: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    if not 0 <= int(value) < (1 << bits):
        raise ValueError(f"{name} must be between 0 and {(1 << bits) - 1}, not {value}")
