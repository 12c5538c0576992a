"""Load a built TSIM library with ctypes and run programs on it: one call into C++ per run, never one per cycle.

The DRAM image is a numpy ``uint8`` array shared with the harness: the core reads and writes it in place (the array
must be C-contiguous and writeable; :meth:`Model.run` works on a copy unless ``in_place=True``). Stops other than
FINISH become exceptions: :class:`TsimMemoryError` (an access outside the image, naming the address),
:class:`TsimWatchdogError` (no progress: each module's state, the last instruction it took, the counters) and
:class:`TsimBudgetError` (the cycle budget ran out). A run may put seeded random backpressure and extra read latency
on the memory port (:class:`Stall`; off by default). The DRAM may be sparse: ``windows`` adds buffers at high byte
addresses (:meth:`Model.run`), so a program can address hundreds of megabytes cheaply. :meth:`Model.run_series` runs
programs one after another on the same model, asserting its reset between them, as a host does between jobs.
"""
from __future__ import annotations

import ctypes
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from vta.config import VTAConfig
from vta.counters import CSR_COUNTERS, CYCLE_CLASSES, MODULES

from .build import Build

__all__ = ["TsimError", "TsimMemoryError", "TsimWatchdogError", "TsimBudgetError", "TsimMismatchError", "Model",
           "RunOutput", "ModuleState", "Stall", "SLICE_SECONDS", "load", "module_states", "token_occupancy",
           "memory_culprit", "default_drain_cycles", "MAX_WINDOWS", "DEFAULT_RESET_CYCLES"]

_DONE, _BUDGET, _WATCHDOG, _MEM_ERROR, _BAD_ARGS, _RUNNING = 0, 1, 2, 3, 4, 5

SLICE_SECONDS = 0.1
"""Target wall time of one call into the C++ clock loop, seconds: Python handles Ctrl-C between calls."""
MAX_WINDOWS = 8
"""DRAM windows a run may have, the image at address 0 included (the harness's ``TSIM_MAX_WINDOWS``)."""
DEFAULT_RESET_CYCLES = 4
"""Cycles the harness holds ``rst`` high before each program (the same as before a fresh model's first program)."""
_FIRST_SLICE = 1 << 14  # cycles in the first call; later calls scale towards SLICE_SECONDS
_MAX_SLICE = 1 << 22


class TsimError(RuntimeError):
    """A co-simulation run did not reach FINISH. ``counters`` holds the core's counters when it stopped."""

    def __init__(self, message: str, *, cycles: int, counters: Mapping[str, int]) -> None:
        super().__init__(message)
        self.cycles = cycles
        self.counters = dict(counters)


class TsimMemoryError(TsimError):
    """The core addressed memory outside the program's DRAM image (or misaligned): ``address`` (bytes), ``nbytes``,
    ``write`` (True for a write beat, False for a read request), ``insn_index``: the instruction that made the access
    when it can be known (see :func:`memory_culprit`), else None."""

    def __init__(self, message: str, *, address: int, nbytes: int, write: bool, cycles: int,
                 counters: Mapping[str, int], insn_index: int | None = None) -> None:
        super().__init__(message, cycles=cycles, counters=counters)
        self.address = address
        self.nbytes = nbytes
        self.write = write
        self.insn_index = insn_index


@dataclass(frozen=True)
class ModuleState:
    """What one module was doing when the watchdog fired: ``state`` is ``idle``, ``busy``, ``wait_token`` or
    ``wait_mem`` (its cycle class in the last cycle); ``insns_done`` counts the instructions it completed;
    ``last_insn`` describes the instruction it took last (the one it was working on), when known; ``insn_index`` is
    that instruction's index when the module holds it (not idle); ``waits_for`` says what a module in
    ``wait_token`` waits for (a token, room in a token queue or, for fetch, in a command queue), when known."""

    module: str
    state: str
    insns_done: int
    last_insn: str | None = None
    insn_index: int | None = None
    waits_for: str | None = None

    def __str__(self) -> str:
        text = f"{self.module}: {self.state}, {self.insns_done} instructions done"
        text += f", last took {self.last_insn}" if self.last_insn else ""
        return text + (f", waits for {self.waits_for}" if self.waits_for else "")

    def summary(self) -> str:
        """One phrase for a stuck module: which instruction it holds and in which state."""
        held = f" holds {self.last_insn}" if self.insn_index is not None else ""
        waits = f", waiting for {self.waits_for}" if self.waits_for else ""
        return f"{self.module}{held} in {self.state}{waits}"


class TsimWatchdogError(TsimError):
    """No module made progress for ``idle_cycles`` cycles; ``modules`` lists each module's :class:`ModuleState`,
    ``tokens`` the tokens in each queue (see :func:`token_occupancy`; empty when the instructions were not given)."""

    def __init__(self, message: str, *, modules: Sequence[ModuleState], idle_cycles: int, cycles: int,
                 counters: Mapping[str, int], tokens: Mapping[str, int] | None = None) -> None:
        super().__init__(message, cycles=cycles, counters=counters)
        self.modules = tuple(modules)
        self.idle_cycles = idle_cycles
        self.tokens = dict(tokens or {})

    @property
    def stuck(self) -> tuple[str, ...]:
        """The modules that were not idle when the run stopped."""
        return tuple(m.module for m in self.modules if m.state != "idle")


class TsimBudgetError(TsimError):
    """The run used its whole cycle budget without reaching FINISH."""


class TsimMismatchError(TsimError):
    """The RTL reached FINISH with a result that differs from the functional simulator's (the spec): ``mismatch``
    is the first differing DRAM byte (a :class:`vta.tsim.compare.Mismatch`, or None when the images are equal),
    ``where`` the allocation it lies in, ``stats_differing`` maps each differing statistic to (fsim, tsim)."""

    def __init__(self, message: str, *, mismatch: Any, where: str, stats_differing: Mapping[str, tuple[int, int]],
                 cycles: int, counters: Mapping[str, int]) -> None:
        super().__init__(message, cycles=cycles, counters=counters)
        self.mismatch = mismatch
        self.where = where
        self.stats_differing = dict(stats_differing)


class _Info(ctypes.Structure):
    _fields_ = [("cycles", ctypes.c_uint64), ("idle_cycles", ctypes.c_uint64), ("err_addr", ctypes.c_uint64),
                ("err_bytes", ctypes.c_uint64), ("status", ctypes.c_int32), ("err_write", ctypes.c_int32),
                ("rd_requests", ctypes.c_uint64), ("rd_beats", ctypes.c_uint64), ("wr_beats", ctypes.c_uint64),
                ("done_cycle", ctypes.c_uint64)]


_STALL_ONE = 1 << 16
"""The harness's probabilities are in units of 1/65536."""


@dataclass(frozen=True)
class Stall:
    """Seeded random backpressure and extra read latency on the memory port for one run (the harness's
    ``tsim_stall``): in each cycle the host holds ``mem_rd_req_ready`` low with probability ``rd_req``, holds back a
    read beat it could present with probability ``rd_data``, and holds ``mem_wr_ready`` low with probability ``wr``
    (each in [0, 1), resolved to 1/65536); each read request's first beat comes 0..``extra_latency`` cycles
    (uniform) after the run's read latency, requests still in order. The same ``seed`` (0 .. 2**64-1) on the same
    core and program gives the same run, cycle for cycle. A core that loses or duplicates a beat or a token when a
    handshake stalls then hangs or computes wrong data."""

    seed: int
    rd_req: float = 0.25
    rd_data: float = 0.25
    wr: float = 0.25
    extra_latency: int = 16

    def __post_init__(self) -> None:
        problems = []
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or \
                not 0 <= int(self.seed) < 1 << 64:
            problems.append(f"seed must be an integer from 0 to 2**64-1, not {self.seed!r}")
        for name in ("rd_req", "rd_data", "wr"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or \
                    not 0 <= float(value) < 1:
                problems.append(f"{name} must be a probability in [0, 1), not {value!r}")
        if isinstance(self.extra_latency, bool) or not isinstance(self.extra_latency, (int, np.integer)) or \
                not 0 <= int(self.extra_latency) < 1 << 32:
            problems.append(f"extra_latency must be a number of cycles from 0 to 2**32-1, not {self.extra_latency!r}")
        if problems:
            raise ValueError("bad random backpressure (Stall): " + "; ".join(problems))

    def units(self) -> tuple[int, int, int]:
        """``rd_req``, ``rd_data``, ``wr`` in the harness's units (of 65536)."""
        return tuple(min(_STALL_ONE - 1, round(float(p) * _STALL_ONE))  # type: ignore[return-value]
                     for p in (self.rd_req, self.rd_data, self.wr))

    def __str__(self) -> str:
        return (f"random backpressure seed {self.seed} (rd_req_ready low {self.rd_req:.0%}, read beats held "
                f"{self.rd_data:.0%}, wr_ready low {self.wr:.0%} of cycles, 0-{self.extra_latency} extra read cycles)")


def default_drain_cycles(latency: int) -> int:
    """Cycles without progress after ``done`` that end a run by default (:meth:`Model.run`'s ``drain_cycles``) at a
    read latency of ``latency`` cycles: a core that makes no progress after ``done`` is clocked exactly this many
    cycles after it (:attr:`RunOutput.drain_cycles`)."""
    return 4 * latency + 256


@dataclass
class RunOutput:
    """One finished run: ``cycles`` (harness cycles from start to done), ``counters`` (name -> value, the core's
    counters in :data:`vta.counters.CSR_COUNTERS` order), the host's view of the memory traffic (``rd_requests``,
    ``rd_beats``, ``wr_beats``), ``drain_cycles``, the cycles clocked after done to let late work finish, and
    ``stalls``, the cycles random backpressure (:class:`Stall`) held ``mem_rd_req_ready`` low, held a read beat back
    and held ``mem_wr_ready`` low (zeros without it)."""

    cycles: int
    counters: dict[str, int] = field(default_factory=dict)
    rd_requests: int = 0
    rd_beats: int = 0
    wr_beats: int = 0
    drain_cycles: int = 0
    stalls: tuple[int, int, int] = (0, 0, 0)


_P = ctypes.POINTER


class Model:
    """A loaded TSIM library for one config. Stateless between runs: every :meth:`run` starts a fresh core (and
    :meth:`run_series` one fresh core for its whole series)."""

    def __init__(self, build: Build) -> None:
        self.build = build
        self.cfg: VTAConfig = build.cfg
        self._lib = ctypes.CDLL(str(build.library))
        fn = self._lib.tsim_open
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                       ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32]
        fn = self._lib.tsim_resume
        fn.restype = ctypes.c_int32
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                       _P(ctypes.c_uint64), _P(ctypes.c_uint64), ctypes.c_uint32, _P(_Info)]
        self._lib.tsim_close.restype = None
        self._lib.tsim_close.argtypes = [ctypes.c_void_p]
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
            insns: Sequence[object] | None = None, two_phase: bool = False, budget_note: str = "",
            stall: Stall | None = None, windows: Sequence[tuple[int, np.ndarray]] = ()) -> tuple[np.ndarray, RunOutput]:
        """Run ``insn_count`` instructions at byte address ``insn_addr`` of the DRAM image ``dram`` (uint8, 1-D).

        ``max_cycles``: cycle budget (0: none). ``watchdog_cycles``: cycles without progress before stopping (0:
        off). ``latency``: read latency in cycles (default ``cfg.dram_latency``). ``drain_cycles``: after ``done``,
        keep clocking until nothing progresses for this many cycles (default ``4 * latency + 256``; 0: stop at done),
        so loads that FINISH did not wait for still show in the counters. ``trace``: waveform file to write
        for cycles ``trace_window = (first, end)`` (default all), needs a library built with trace support.
        ``insns``: the decoded instruction stream, used only to name instructions in errors (the one each module
        held when the watchdog fired, the one that made a bad memory access). ``two_phase``: evaluate the model at
        both clock edges, the reference scheduling (slower; the default evaluates once per cycle, which gives the
        same results: see ``harness.cc``); a traced run is always two-phase, so the waveform shows both clock edges.
        ``budget_note``: appended to the :class:`TsimBudgetError` message (how the budget was chosen). ``stall``:
        random backpressure and extra read latency on the memory port (:class:`Stall`; None: off); the cycle budget
        is the caller's to widen for it. ``windows``: more DRAM, as (byte address, uint8 array) pairs, each array
        read and written in place (C-contiguous and writeable), at an address that is a multiple of the bus width,
        above the image and apart from each other (at most :data:`MAX_WINDOWS` - 1): a request outside every
        window, or across two, is a :class:`TsimMemoryError`.

        The clock loop runs in C++ in slices of about :data:`SLICE_SECONDS` each, so Ctrl-C (KeyboardInterrupt)
        stops a run within a fraction of a second; the interrupted run's model is discarded, the library stays
        usable. Returns the final DRAM (``dram`` itself when ``in_place``, else a copy) and a :class:`RunOutput`;
        raises a :class:`TsimError` subclass when FINISH is not reached.
        """
        image = _check_dram(dram, in_place)
        _check_uint("insn_addr", insn_addr, 32)
        _check_uint("insn_count", insn_count, 32)
        _check_uint("max_cycles", max_cycles, 64)
        _check_uint("watchdog_cycles", watchdog_cycles, 64)
        latency = self.cfg.dram_latency if latency is None else latency
        _check_uint("latency", latency, 32)
        drain_cycles = default_drain_cycles(latency) if drain_cycles is None else drain_cycles
        _check_uint("drain_cycles", drain_cycles, 64)
        trace_arg, begin, end = self._trace_args(trace, trace_window)
        if stall is not None and not isinstance(stall, Stall):
            raise TypeError(f"stall must be a vta.tsim.bridge.Stall or None, not {type(stall).__name__}")
        extra = _check_windows(windows, image.size, self.cfg.bus_bytes)
        stall_fn = self._stall_functions() if stall is not None else None
        handle = self._lib.tsim_open(image.ctypes.data, image.size, insn_addr, insn_count, latency, trace_arg, begin,
                                     end, int(bool(two_phase)))
        stalls = (ctypes.c_uint64 * 3)()
        try:
            self._add_windows(handle, extra)
            if stall is not None and stall_fn is not None:
                if stall_fn[0](handle, int(stall.seed), *stall.units(), int(stall.extra_latency)) != 0:
                    raise ValueError(f"the harness refused the backpressure settings {stall!r}")
            status, info, values, before = self._drive(handle, max_cycles, watchdog_cycles, drain_cycles)
            if stall_fn is not None:
                stall_fn[1](handle, stalls)
        finally:
            self._lib.tsim_close(handle)
        if status == _DONE:
            return image, _output(info, values, (int(stalls[0]), int(stalls[1]), int(stalls[2])))
        raise self._error(status, info, values, before, image.size, insns, insn_addr, budget_note, len(extra))

    def run_series(self, programs: Sequence[Any], *, cuts: Sequence[int | None] | None = None,
                   reset_cycles: int = DEFAULT_RESET_CYCLES, max_cycles: int = 0, watchdog_cycles: int = 10_000,
                   latency: int | None = None, drain_cycles: int | None = None,
                   two_phase: bool = False) -> list[tuple[np.ndarray, RunOutput] | None]:
        """Run :class:`vta.program.Program` s one after another on ONE model, asserting the core's ``rst`` for
        ``reset_cycles`` cycles before each (the SRAM buffers keep their contents; the host forgets its outstanding
        reads), as a host does between jobs. Each program runs on a copy of its own DRAM image. ``cuts[i]``: None
        runs program ``i`` to FINISH (and its drain), a number of cycles stops it there, done or not, and the reset
        that follows lands wherever the core was (default: every program to FINISH). ``max_cycles`` (0: none),
        ``watchdog_cycles``, ``latency``, ``drain_cycles`` and ``two_phase`` as in :meth:`run`, for each program.

        Returns, per program, its final DRAM and :class:`RunOutput`, or None for a cut program; raises the
        :class:`TsimError` of the first program that does not reach FINISH (its index in the message)."""
        programs = list(programs)
        cuts = [None] * len(programs) if cuts is None else list(cuts)
        if len(cuts) != len(programs):
            raise ValueError(f"run_series needs one cut per program: {len(programs)} programs, {len(cuts)} cuts")
        if not programs:
            raise ValueError("run_series needs at least one program")
        for cut in cuts:
            if cut is not None:
                _check_uint("a cut", cut, 64)
        for name, value, bits in (("reset_cycles", reset_cycles, 32), ("max_cycles", max_cycles, 64),
                                  ("watchdog_cycles", watchdog_cycles, 64)):
            _check_uint(name, value, bits)
        latency = self.cfg.dram_latency if latency is None else latency
        _check_uint("latency", latency, 32)
        drain_cycles = default_drain_cycles(latency) if drain_cycles is None else drain_cycles
        _check_uint("drain_cycles", drain_cycles, 64)
        images = [np.array(p.dram, dtype=np.uint8) for p in programs]  # each a fresh, owned copy
        results: list[tuple[np.ndarray, RunOutput] | None] = []
        handle = None
        try:
            for k, (program, image, cut) in enumerate(zip(programs, images, cuts)):
                insn_addr, insn_count = int(program.insn_offset), len(program.insns)
                _check_uint("insn_addr", insn_addr, 32)
                if handle is None:
                    handle = self._lib.tsim_open(image.ctypes.data, image.size, insn_addr, insn_count, latency, None,
                                                 0, 0, int(bool(two_phase)))
                elif self._restart()(handle, image.ctypes.data, image.size, insn_addr, insn_count, reset_cycles):
                    raise ValueError(f"the harness refused to reset the core before program {k}")
                if cut is not None:
                    status, info, values, before = self._drive(handle, cut, 0, 0)
                    if status not in (_DONE, _BUDGET):
                        raise self._error(status, info, values, before, image.size, list(program.insns), insn_addr,
                                          f" (program {k} of the series, cut at cycle {cut})")
                    results.append(None)
                    continue
                status, info, values, before = self._drive(handle, max_cycles, watchdog_cycles, drain_cycles)
                if status != _DONE:
                    raise self._error(status, info, values, before, image.size, list(program.insns), insn_addr,
                                      f" (program {k} of the series)")
                results.append((image, _output(info, values, (0, 0, 0))))
        finally:
            if handle is not None:
                self._lib.tsim_close(handle)
        return results

    def _drive(self, handle: Any, max_cycles: int, watchdog_cycles: int,
               drain_cycles: int) -> tuple[int, _Info, dict[str, int], dict[str, int]]:
        """Clock an opened run in slices of about :data:`SLICE_SECONDS` until it stops: its status, figures and
        counters (and the counters a cycle before the last, for the watchdog's report)."""
        n = len(CSR_COUNTERS)
        counters = (ctypes.c_uint64 * n)()
        before = (ctypes.c_uint64 * n)()
        info = _Info()
        slice_cycles = _FIRST_SLICE
        while True:
            start = time.perf_counter()
            status = self._lib.tsim_resume(handle, slice_cycles, max_cycles, watchdog_cycles, drain_cycles,
                                           counters, before, n, ctypes.byref(info))
            if status != _RUNNING:
                break
            seconds = time.perf_counter() - start
            scale = SLICE_SECONDS / seconds if seconds > 0 else 4.0
            slice_cycles = int(min(_MAX_SLICE, max(_FIRST_SLICE, slice_cycles * min(4.0, scale))))
        return (status, info, dict(zip(CSR_COUNTERS, (int(v) for v in counters))),
                dict(zip(CSR_COUNTERS, (int(v) for v in before))))

    def _add_windows(self, handle: Any, windows: Sequence[tuple[int, np.ndarray]]) -> None:
        if not windows:
            return
        fn = self._harness_function("tsim_window", "sparse DRAM", ctypes.c_int32,
                                    [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64])
        for base, array in windows:
            if fn(handle, base, array.ctypes.data, array.size) != 0:
                raise ValueError(f"the harness refused the DRAM window of {array.size} bytes at {base:#x}")

    def _restart(self) -> Any:
        """The harness's ``tsim_restart`` (ValueError for a library built without it)."""
        return self._harness_function("tsim_restart", "a reset between programs", ctypes.c_int32,
                                      [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                                       ctypes.c_uint32, ctypes.c_uint32])

    def _harness_function(self, name: str, feature: str, restype: Any, argtypes: list[Any]) -> Any:
        """The harness's C function ``name`` with its result and argument types set; a ValueError naming
        ``feature`` for a library built from a harness without it (an older build: rebuild it)."""
        try:
            fn = getattr(self._lib, name)
        except AttributeError:
            raise ValueError(f"the library {self.build.library} was built from a harness without {feature} "
                             f"({name}); rebuild it") from None
        fn.restype = restype
        fn.argtypes = argtypes
        return fn

    def run_program(self, program: Any, **options: Any) -> tuple[np.ndarray, RunOutput]:
        """:meth:`run` on a :class:`vta.program.Program`: its DRAM image, instruction offset and instruction stream;
        ``options`` are :meth:`run`'s keyword arguments."""
        insns = list(program.insns)
        return self.run(np.asarray(program.dram, dtype=np.uint8), insn_addr=int(program.insn_offset),
                        insn_count=len(insns), insns=insns, **options)

    def _stall_functions(self) -> tuple[Any, Any]:
        """The harness's ``tsim_stall`` and ``tsim_stall_counts`` (ValueError for a library built without them)."""
        fn = self._harness_function("tsim_stall", "random backpressure", ctypes.c_int32,
                                    [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32,
                                     ctypes.c_uint32, ctypes.c_uint32])
        counts = self._harness_function("tsim_stall_counts", "random backpressure", None,
                                        [ctypes.c_void_p, _P(ctypes.c_uint64)])
        return fn, counts

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
               insns: Sequence[object] | None, insn_addr: int, budget_note: str, windows: int = 0) -> TsimError:
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
                        f"outside the {size}-byte DRAM image" + (f" and its {windows} windows" if windows else ""))
            culprit = memory_culprit(self.cfg, addr, bool(info.err_write), values, insns, insn_addr)
            whose = ""
            if culprit is not None and insns is not None:
                whose = f" for instruction {culprit[0]} ({_describer()(insns[culprit[0]])}) of the {culprit[1]} module"
            return TsimMemoryError(f"the core made {what} at cycle {cycles}{whose}; the run was stopped",
                                   address=addr, nbytes=nbytes, write=bool(info.err_write), cycles=cycles,
                                   counters=values, insn_index=None if culprit is None else culprit[0])
        if status == _WATCHDOG:
            modules = module_states(values, before, insns)
            tokens = token_occupancy(self.cfg, values, modules, insns)
            stuck = [m for m in modules if m.state != "idle"]
            idle = int(info.idle_cycles)
            head = f"no module made progress for {idle} cycles (at cycle {cycles}); the run was stopped"
            if stuck:
                head += ". Stuck: " + "; ".join(m.summary() for m in stuck)
            else:
                head += ". Every module is idle, yet done never rose"
            if tokens:
                depth = self.cfg.token_queue_depth
                head += (f". Token queues (tokens held of {depth}): "
                         + ", ".join(f"{q.replace('_to_', '->')} {n}" for q, n in tokens.items()))
            lines = "\n".join(f"  {m}" for m in modules)
            return TsimWatchdogError(f"{head}:\n{lines}", modules=modules, tokens=tokens,
                                     idle_cycles=int(info.idle_cycles), cycles=cycles, counters=values)
        if status == _BUDGET:
            return TsimBudgetError(f"the run used its whole budget of {cycles} cycles without reaching FINISH "
                                   f"({values.get('fetch_insns', 0)} instructions fetched, "
                                   f"{values.get('compute_insns', 0)} computed){budget_note}; raise max_cycles if the "
                                   "program is simply long", cycles=cycles, counters=values)
        return TsimError(f"the harness rejected its arguments (status {status})", cycles=cycles, counters=values)


def _routed(insns: Sequence[object] | None) -> dict[str, list[tuple[int, Any]]]:
    """Each module's instructions (index, instruction) in program order, routed as fetch does (fetch sees all)."""
    routed: dict[str, list[tuple[int, Any]]] = {m: [] for m in MODULES}
    if insns is not None:
        from vta.isa import module_of
        for k, insn in enumerate(insns):
            routed["fetch"].append((k, insn))
            routed[module_of(insn)].append((k, insn))  # type: ignore[arg-type]
    return routed


def module_states(after: Mapping[str, int], before: Mapping[str, int],
                  insns: Sequence[object] | None = None) -> list[ModuleState]:
    """Each module's state in the cycle between two counter snapshots, and the instruction it took last.

    The state is the cycle class whose counter grew (``idle`` when none did). The last instruction is looked up in
    ``insns`` (the program's decoded stream) by routing every instruction to its module as fetch does; a module that
    is not idle holds it (``insn_index``).
    """
    routed = _routed(insns)
    describe = _describer()
    out = []
    for m in MODULES:
        grew = [c for c in CYCLE_CLASSES if after.get(f"{m}_{c}", 0) > before.get(f"{m}_{c}", 0)]
        state = grew[0] if grew else "idle"
        done = after.get(f"{m}_insns", 0)
        last, index = None, None
        if routed[m]:
            k = min(done - 1 if state == "idle" else done, len(routed[m]) - 1)
            if k >= 0:
                index, insn = routed[m][k]
                last = f"instruction {index} ({describe(insn)})"
        out.append(ModuleState(m, state, done, last, index if state != "idle" else None))
    return out


def token_occupancy(cfg: VTAConfig, after: Mapping[str, int], modules: list[ModuleState],
                    insns: Sequence[object] | None) -> dict[str, int]:
    """The tokens in each queue when the core stopped (in :data:`vta.isa.TOKEN_QUEUES` order), derived from the
    instruction stream: the pushes minus the pops of the instructions each module completed (``*_insns``), minus the
    pops of the instructions modules hold and have started (every pop available: the core pops them all at once).
    Fills in each stuck module's ``waits_for`` (in place). Empty when ``insns`` is None."""
    if insns is None:
        return {}
    from vta.isa import TOKEN_POPS, TOKEN_QUEUES, insn_pops, insn_pushes
    routed = _routed(insns)
    tokens = dict.fromkeys(TOKEN_QUEUES, 0)
    held: list[tuple[int, ModuleState]] = []
    for state in modules:
        if state.module == "fetch":
            continue
        for _, insn in routed[state.module][:after.get(f"{state.module}_insns", 0)]:
            for q in insn_pushes(insn):
                tokens[q] += 1
            for q in insn_pops(insn):
                tokens[q] -= 1
        if state.insn_index is not None:
            held.append((modules.index(state), state))
    for position, state in held:
        insn = insns[state.insn_index]  # type: ignore[index]
        flags = {q: f for f, q in TOKEN_POPS[state.module].items()}
        pops = {q: flags[q] for q in insn_pops(insn)}  # type: ignore[arg-type]
        pushes = insn_pushes(insn)  # type: ignore[arg-type]
        missing = [q for q in pops if tokens[q] <= 0]
        if state.state == "wait_token" and missing:
            waits = " and ".join(f"a {q.replace('_to_', '->')} token ({pops[q]})" for q in missing)
        else:
            for q in pops:
                tokens[q] -= 1
            full = [q for q in pushes if tokens[q] >= cfg.token_queue_depth]
            waits = " and ".join(f"room in the full {q.replace('_to_', '->')} queue" for q in full)
        if state.state == "wait_token":
            modules[position] = dataclasses.replace(state, waits_for=waits or "nothing the token counts explain")
    fetch = next((i for i, m in enumerate(modules) if m.module == "fetch"), None)
    if fetch is not None and modules[fetch].state == "wait_token" and modules[fetch].insn_index is not None:
        from vta.isa import module_of
        target = module_of(insns[modules[fetch].insn_index])  # type: ignore[arg-type, index]
        modules[fetch] = dataclasses.replace(modules[fetch], waits_for=f"room in the full {target} command queue "
                                                                       f"({cfg.cmd_queue_depth} instructions)")
    return tokens


def memory_culprit(cfg: VTAConfig, address: int, write: bool, counters: Mapping[str, int],
                   insns: Sequence[object] | None, insn_addr: int) -> tuple[int, str] | None:
    """The instruction (index, module) whose memory access at byte ``address`` stopped the run, when it can be
    known: a LOAD (reads) or STORE (writes) that its module holds or has just finished (by the ``*_insns``
    counters) and whose DRAM rows contain the address, or, for a read within the instruction stream, the instruction
    fetch was reading. None when no instruction matches (or ``insns`` is None)."""
    if insns is None:
        return None
    from vta.isa import Load, Store, layout
    routed = _routed(insns)
    kinds = (Store,) if write else (Load,)
    for module in ("store",) if write else ("load", "compute"):
        done = counters.get(f"{module}_insns", 0)
        for k, insn in routed[module][max(0, done - 1):done + 2]:
            if not isinstance(insn, kinds) or insn.y_size == 0 or insn.x_size == 0:
                continue
            try:
                eb = cfg.elem_bytes(insn.mem)
            except ValueError:
                continue
            for row in range(insn.y_size):
                lo = (insn.dram_base + row * insn.x_stride) * eb
                if lo - lo % cfg.bus_bytes <= address < lo + insn.x_size * eb:
                    return k, module
    insn_bytes = layout(cfg).insn_bytes
    if not write and insn_addr <= address < insn_addr + len(insns) * insn_bytes:
        return (address - insn_addr) // insn_bytes, "fetch"
    return None


def _describer() -> Callable[[object], str]:
    try:
        from vta.asm import format_insn
    except ImportError:  # the disassembler is optional here
        return repr
    return format_insn  # type: ignore[return-value]


def load(build: Build) -> Model:
    """A :class:`Model` for a :class:`~vta.tsim.build.Build`."""
    return Model(build)


def _output(info: _Info, values: dict[str, int], stalls: tuple[int, int, int]) -> RunOutput:
    return RunOutput(int(info.done_cycle), values, int(info.rd_requests), int(info.rd_beats), int(info.wr_beats),
                     int(info.cycles) - int(info.done_cycle), stalls)


def _check_windows(windows: Sequence[tuple[int, np.ndarray]], image_bytes: int,
                   bus_bytes: int) -> list[tuple[int, np.ndarray]]:
    """``windows`` checked (see :meth:`Model.run`): sorted by address."""
    if len(windows) > MAX_WINDOWS - 1:
        raise ValueError(f"a run takes at most {MAX_WINDOWS - 1} DRAM windows besides the image, not {len(windows)}")
    out = []
    for base, array in windows:
        _check_uint("a DRAM window's address", base, 64)
        if not isinstance(array, np.ndarray) or array.dtype != np.uint8 or array.ndim != 1 or array.size == 0:
            raise TypeError(f"the DRAM window at {int(base):#x} must be a non-empty 1-D uint8 array")
        if not (array.flags.c_contiguous and array.flags.writeable):
            raise ValueError(f"the DRAM window at {int(base):#x} must be C-contiguous and writeable (it is used in "
                             "place)")
        if int(base) % bus_bytes:
            raise ValueError(f"the DRAM window at {int(base):#x} must start at a multiple of the {bus_bytes}-byte "
                             "bus width")
        out.append((int(base), array))
    out.sort(key=lambda w: w[0])
    end = -(-image_bytes // bus_bytes) * bus_bytes
    for base, array in out:
        if base < end:
            raise ValueError(f"the DRAM window at {base:#x} overlaps the image or the window below it (which end at "
                             f"{end:#x})")
        end = base + -(-array.size // bus_bytes) * bus_bytes
    if end > 1 << 64:
        raise ValueError(f"the DRAM window at {out[-1][0]:#x} runs past 2**64")
    return out


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
