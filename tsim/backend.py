"""The ``tsim`` backend: runs a :class:`~vta.program.Program` on the Verilator model of the generated core.

Same interface as the functional simulator's backend (``vta.backend.get_backend('tsim')``): ``run(program,
**options) -> RunResult(backend, dram, stats, cycles, counters)``. The model for the program's config is built (or
taken from the cache) on first use and kept loaded by the backend instance.

By default (``check="fsim"``) tsim checks what the functional simulator checks and never returns a silently wrong
result: the program first runs on :func:`vta.fsim.run` (with its race check), whose
:class:`~vta.fsim.SimulationError` (same class, same ``insn_index``: out of range, invalid instruction, deadlock,
race) propagates unchanged before any Verilator build or run starts; then the RTL runs, and a final DRAM image or a
statistic that differs from fsim's raises :class:`~vta.tsim.bridge.TsimMismatchError` naming the first differing
address, its allocation and both values. ``check="none"`` runs the RTL alone (raw speed, or programs fsim rejects).

Options of :meth:`TSimBackend.run` (defaults from the constructor, which takes the same keywords):
    check: ``"fsim"`` (default) or ``"none"``, see above.
    max_cycles: cycle budget; 0 (default) derives one from the program (:func:`cycle_budget`), so a hang stops with
        :class:`~vta.tsim.bridge.TsimBudgetError` naming the budget and its derivation.
    watchdog_cycles: cycles without progress before the run stops with a report (default 100_000; 0: off).
    trace: waveform file (``.fst`` or ``.vcd``); the model is then built with trace support.
    trace_window: ``(first, end)`` cycles to record (default: all).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vta.backend import Backend, RunResult
from vta.config import MEM_ACC, MEM_INP, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig
from vta.counters import INSN_COUNTERS, STAT_COUNTERS

from .bridge import Model, RunOutput, TsimMismatchError
from .build import Build, build

__all__ = ["TSimBackend", "Budget", "cycle_budget", "stats_from_counters", "CHECKS", "STAT_COUNTERS",
           "INSN_COUNTERS"]

log = logging.getLogger(__name__)

# STAT_COUNTERS (micro-ops and bytes) and INSN_COUNTERS (instructions per module): the hardware counters that equal
# the functional simulator's statistics on the same program; defined in vta.counters, exported here as before.

DEFAULT_WATCHDOG = 100_000
CHECKS = ("fsim", "none")
"""Values of the ``check`` option: validate on the functional simulator and compare (default), or run raw."""

BUDGET_FACTOR = 4
"""The derived cycle budget allows this many times the program's work (see :func:`cycle_budget`)."""
BUDGET_SLACK = 10_000
"""Cycles the derived budget adds on top (reset, pipeline fill, the last instruction's latency)."""
INSN_OVERHEAD = 16
"""Cycles of work the derived budget counts per instruction on top of its data (decode, token handshakes)."""


def stats_from_counters(counters: dict[str, int], program: Any = None) -> dict[str, int]:
    """The functional simulator's statistics from the core's counters.

    Measured by the hardware: micro-op counts, bytes moved by kind (:data:`STAT_COUNTERS`) and instructions per
    module. With ``program`` (which ran to FINISH) also the figures that follow from its instruction stream:
    ``macs`` (``BATCH*BLOCK_IN*BLOCK_OUT`` per measured GEMM micro-op, minus the micro-ops of the GEMMs that multiply
    nothing, :func:`vta.isa.gemm_multiplies`) and the token pushes and pops of each queue
    (:func:`vta.counts.token_counts`), with the functional simulator's names.
    """
    stats = {name: int(counters[name]) for name in STAT_COUNTERS + INSN_COUNTERS}
    if program is None:
        return stats
    from vta.counts import token_counts
    from vta.isa import Gemm, gemm_multiplies, insn_uops
    cfg = program.cfg
    idle_uops = sum(insn_uops(i) for i in program.insns if isinstance(i, Gemm) and not gemm_multiplies(i, cfg))
    stats["macs"] = (stats["gemm_uops"] - idle_uops) * cfg.macs_per_cycle
    stats.update(token_counts(program.insns))
    return stats


@dataclass(frozen=True)
class Budget:
    """A derived cycle budget: ``cycles`` in all, ``work`` (module -> cycles of work it does if nothing overlaps),
    and the terms added on top: ``watchdog`` (so a stall is reported by the watchdog first), ``drain`` and
    ``slack`` (:data:`BUDGET_SLACK`)."""

    cycles: int
    work: dict[str, int]
    watchdog: int
    drain: int
    slack: int

    def __str__(self) -> str:
        parts = ", ".join(f"{m} {c:,}" for m, c in self.work.items())
        return (f"{BUDGET_FACTOR} x {sum(self.work.values()):,} cycles of work ({parts}: element pieces over the "
                f"bus, micro-ops, DRAM latency per request row, {INSN_OVERHEAD} per instruction) + {self.watchdog:,} "
                f"watchdog + {self.drain:,} drain + {self.slack:,} slack = {self.cycles:,} cycles")


def cycle_budget(program: Any, *, watchdog_cycles: int = DEFAULT_WATCHDOG, latency: int | None = None) -> Budget:
    """A generous cycle budget for ``program`` (``cfg`` and ``insns``), derived from its instruction stream, the
    figures fsim's statistics count: per module the cycles of its work if nothing overlapped: fetch one bus request
    per instruction (``insn_bytes / bus_bytes`` beats plus the DRAM latency), a LOAD or STORE one piece per element
    written or read, padding included (an element of E bytes is ``ceil(E / bus_bytes)`` pieces), plus the latency
    per row requested, a GEMM or ALU one cycle per micro-op, and :data:`INSN_OVERHEAD` per instruction; then
    :data:`BUDGET_FACTOR` times their sum, plus the watchdog window, the drain after done (``4 * latency + 256``)
    and :data:`BUDGET_SLACK`. Invalid fields (a memory type no buffer has) count as the largest element."""
    from vta.isa import Alu, Gemm, Load, Store, layout, module_of
    cfg: VTAConfig = program.cfg
    bus = cfg.bus_bytes
    latency = cfg.dram_latency if latency is None else latency
    largest = max(cfg.elem_bytes(m) for m in (MEM_UOP, MEM_WGT, MEM_INP, MEM_ACC, MEM_OUT))
    work = {"fetch": 0, "load": 0, "compute": 0, "store": 0}
    fetch_each = -(-layout(cfg).insn_bytes // bus) + latency + INSN_OVERHEAD
    for insn in program.insns:
        work["fetch"] += fetch_each
        cycles = INSN_OVERHEAD
        if isinstance(insn, (Load, Store)):
            try:
                eb = cfg.elem_bytes(insn.mem)
            except ValueError:
                eb = largest
            pieces = -(-eb // bus)
            height = insn.y_size + insn.y_pad_0 + insn.y_pad_1
            width = insn.x_size + insn.x_pad_0 + insn.x_pad_1
            cycles += height * width * pieces + insn.y_size * (latency + 1)
        elif isinstance(insn, (Gemm, Alu)):
            cycles += insn.iter_out * insn.iter_in * max(0, insn.uop_end - insn.uop_bgn)
        work[module_of(insn)] += cycles
    drain = 4 * latency + 256
    total = BUDGET_FACTOR * sum(work.values()) + watchdog_cycles + drain + BUDGET_SLACK
    return Budget(total, work, watchdog_cycles, drain, BUDGET_SLACK)


class TSimBackend(Backend):
    """Cycle-accurate RTL co-simulation in Verilator. ``check``, ``max_cycles`` and ``watchdog_cycles`` are the
    defaults of :meth:`run`'s options of the same names (see the module docstring). ``generator``/``sources`` swap
    the RTL (tests use a stand-in core); by default the core comes from ``vta.hw.verilog``. ``pgo``: build the model
    with profile-guided optimization (:func:`vta.tsim.build.build`'s option; None: its default, on for the real core):
    False builds about twice as fast and runs about 30% slower, the better trade for a model run once (a sweep's
    exact point)."""

    name = "tsim"

    def __init__(self, *, check: str = "fsim", max_cycles: int = 0, watchdog_cycles: int = DEFAULT_WATCHDOG,
                 generator: Callable[[VTAConfig, Path], Path] | None = None, sources: list[Path] | None = None,
                 progress: bool | None = None, pgo: bool | None = None) -> None:
        self.check = _check_option(check)
        self.max_cycles = _check_count("max_cycles", max_cycles)
        self.watchdog_cycles = _check_count("watchdog_cycles", watchdog_cycles)
        self._generator = generator
        self._sources = sources
        self._progress = progress
        self._pgo = pgo
        self._models: dict[tuple[VTAConfig, str], Model] = {}

    def model(self, cfg: VTAConfig, trace: str = "none") -> Model:
        """The loaded model for ``cfg`` (built or taken from the cache on first use)."""
        key = (cfg, trace)
        if key not in self._models:
            built: Build = build(cfg, trace=trace, generator=self._generator, sources=self._sources,
                                 progress=self._progress, pgo=self._pgo)
            self._models[key] = Model(built)
        return self._models[key]

    def run_raw(self, program: Any, *, max_cycles: int | None = None, watchdog_cycles: int | None = None,
                trace: str | Path | None = None, trace_window: tuple[int, int] | None = None
                ) -> tuple[np.ndarray, RunOutput]:
        """Run ``program`` on the RTL alone (no fsim check) and return the final DRAM image and the harness's
        :class:`~vta.tsim.bridge.RunOutput`. ``max_cycles`` 0 derives the budget (:func:`cycle_budget`); None takes
        the constructor's, likewise ``watchdog_cycles``."""
        cfg = program.cfg
        if not isinstance(cfg, VTAConfig):
            raise TypeError(f"program.cfg must be a VTAConfig, not {type(cfg).__name__}")
        max_cycles = self.max_cycles if max_cycles is None else _check_count("max_cycles", max_cycles)
        watchdog = self.watchdog_cycles if watchdog_cycles is None else _check_count("watchdog_cycles",
                                                                                     watchdog_cycles)
        kind = "none"
        if trace is not None:
            suffix = Path(trace).suffix.lower()
            if suffix not in (".fst", ".vcd"):
                raise ValueError(f"the trace file must end in .fst or .vcd, not {str(trace)!r}")
            kind = suffix[1:]
        if max_cycles:
            note = f" (max_cycles={max_cycles:,})"
        else:
            budget = cycle_budget(program, watchdog_cycles=watchdog)
            max_cycles = budget.cycles
            note = f" (the default budget derived from the program: {budget})"
        model = self.model(cfg, kind)
        log.info("running %d instructions on the RTL (%s), budget %d cycles", len(program.insns), cfg.name,
                 max_cycles)
        return model.run_program(program, max_cycles=max_cycles, watchdog_cycles=watchdog, trace=trace,
                                 trace_window=trace_window, budget_note=note)

    def run(self, program: Any, **options: Any) -> RunResult:
        """Run ``program`` to FINISH; see the module docstring for ``options``. Raises fsim's
        :class:`~vta.fsim.SimulationError` for a program fsim rejects (with ``check="fsim"``), a
        :class:`~vta.tsim.bridge.TsimError` subclass when the run does not reach FINISH, and
        :class:`~vta.tsim.bridge.TsimMismatchError` when its result differs from fsim's."""
        known = {"check", "max_cycles", "watchdog_cycles", "trace", "trace_window"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown tsim option(s) {', '.join(unknown)}; known options are "
                            f"{', '.join(sorted(known))}")
        check = _check_option(options.pop("check", self.check))
        expected = None
        if check == "fsim":
            from vta import fsim
            from vta.program import Program
            if not isinstance(program, Program):
                raise TypeError(f"check='fsim' runs the program on the functional simulator first, which takes a "
                                f"vta.program.Program, not {type(program).__name__}; pass check='none' to run it on "
                                "the RTL alone")
            expected = fsim.run(program)
        dram, out = self.run_raw(program, **options)
        stats = stats_from_counters(out.counters, program)
        if expected is not None:
            _compare(program, expected.dram, expected.stats.as_dict(), dram, stats, out)
        return RunResult(backend=self.name, dram=dram, stats=stats, cycles=out.counters["cycles"],
                         counters=out.counters)


def _compare(program: Any, expected_dram: np.ndarray, expected_stats: dict[str, int], dram: np.ndarray,
             stats: dict[str, int], out: RunOutput) -> None:
    """Raise :class:`TsimMismatchError` when the RTL's DRAM image or statistics differ from fsim's."""
    from .compare import compare_dram, locate
    mismatch = compare_dram(expected_dram, dram)
    keys = sorted(expected_stats.keys() | stats.keys())
    differing = {k: (expected_stats.get(k, 0), stats.get(k, 0)) for k in keys
                 if expected_stats.get(k, 0) != stats.get(k, 0)}
    if mismatch is None and not differing:
        return
    where = "" if mismatch is None else locate(mismatch.address, program.allocations)
    parts = []
    if mismatch is not None:
        parts.append(f"{mismatch}, in {where}")
    if differing:
        parts.append("statistics differ (fsim, tsim): " + ", ".join(f"{k} {a:,} vs {b:,}"
                                                                   for k, (a, b) in differing.items()))
    raise TsimMismatchError(f"the RTL finished a program of {len(program.insns)} instructions at config "
                            f"{program.cfg.name} with a result that differs from the functional simulator's (the "
                            f"spec): {'; '.join(parts)}", mismatch=mismatch, where=where,
                            stats_differing=differing, cycles=out.cycles, counters=out.counters)


def _check_option(check: Any) -> str:
    if check not in CHECKS:
        raise ValueError(f"check must be one of {', '.join(repr(c) for c in CHECKS)}, not {check!r}")
    return str(check)


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative number of cycles, not {value!r}")
    return int(value)
