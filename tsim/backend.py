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
    max_cycles: cycle budget; 0 (default) derives one from the cycle model's prediction for the program
        (:func:`cycle_budget`), so a hang stops with :class:`~vta.tsim.bridge.TsimBudgetError` naming the budget and
        its derivation.
    watchdog_cycles: cycles without progress before the run stops with a report (default 100_000; 0: off).
    trace: waveform file (``.fst`` or ``.vcd``); the model is then built with trace support.
    trace_window: ``(first, end)`` cycles to record (default: all).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vta.backend import Backend, RunResult
from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig
from vta.counters import INSN_COUNTERS, STAT_COUNTERS
from vta.isa import COMMON_FIELDS, Load

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

BUDGET_FACTOR = 8
"""The derived cycle budget allows this many times the cycles the cycle model predicts (:func:`vta.cost.estimate`,
see :func:`cycle_budget`). The model is within 6% of this core on random programs and 1% on GEMMs
(``tests/test_cost.py``), so a correct run ends by ~1.1x its prediction; 8x leaves room for a core slower than the
model's (a foreign core, ``vta.tsim.byo``) and keeps the budgets of long programs near the former derivation's (4x a
no-overlap sum of work, which real GEMM programs overlap about 2x)."""
BUDGET_SLACK = 10_000
"""Cycles the derived budget adds on top (reset, pipeline fill, the last instruction's latency)."""


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
    """A derived cycle budget: ``cycles`` in all; ``predicted``, the cycles the cycle model predicts for the program
    (``as_written`` False: for the program with its tokens ignored, see :func:`cycle_budget`); and the terms added
    on top: ``watchdog`` (so a stall is reported by the watchdog first), ``drain`` and ``slack``
    (:data:`BUDGET_SLACK`)."""

    cycles: int
    predicted: int
    as_written: bool
    watchdog: int
    drain: int
    slack: int

    def __str__(self) -> str:
        what = "predicted by the cycle model" if self.as_written else (
            "predicted by the cycle model for the program with its tokens ignored and unknown memory types taken as "
            "the largest element (the model cannot schedule it as written)")
        return (f"{BUDGET_FACTOR} x {self.predicted:,} cycles {what} + {self.watchdog:,} watchdog + {self.drain:,} "
                f"drain + {self.slack:,} slack = {self.cycles:,} cycles")


def cycle_budget(program: Any, *, watchdog_cycles: int = DEFAULT_WATCHDOG, latency: int | None = None) -> Budget:
    """A generous cycle budget for ``program`` (``cfg`` and ``insns``): :data:`BUDGET_FACTOR` times the cycles the
    cycle model predicts (:func:`vta.cost.estimate_insns`, at DRAM latency ``latency``, default the config's), plus
    the watchdog window, the drain after done (``4 * latency + 256``) and :data:`BUDGET_SLACK`.

    A program the model cannot schedule (a pop no push satisfies, :class:`~vta.cost.CostModelError`: it hangs on
    the core, the watchdog reports it; or a LOAD of a memory type no buffer has) is predicted with every token flag
    cleared and such a LOAD taken as one of the largest element, so its budget still grows with its work."""
    from vta.cost import CostModelError, estimate_insns
    cfg: VTAConfig = program.cfg
    if latency is not None and latency != cfg.dram_latency:
        cfg = cfg.replace(dram_latency=latency)
    insns = list(program.insns)
    as_written = True
    try:
        predicted = estimate_insns(cfg, insns).cycles
    except (CostModelError, ValueError):
        as_written = False
        predicted = estimate_insns(cfg, [_schedulable(insn, cfg) for insn in insns]).cycles
    drain = 4 * cfg.dram_latency + 256
    total = BUDGET_FACTOR * predicted + watchdog_cycles + drain + BUDGET_SLACK
    return Budget(total, predicted, as_written, watchdog_cycles, drain, BUDGET_SLACK)


def _schedulable(insn: Any, cfg: VTAConfig) -> Any:
    """``insn`` with its token flags cleared, and for a LOAD of a memory type no buffer has, the memory type of the
    largest element: what the cycle model can always schedule (:func:`cycle_budget`)."""
    changes: dict[str, Any] = {flag: False for flag in COMMON_FIELDS if flag != "opcode" and getattr(insn, flag)}
    if isinstance(insn, Load) and insn.mem not in _ELEM_MEMS:
        changes["mem"] = max(_ELEM_MEMS, key=cfg.elem_bytes)
    return dataclasses.replace(insn, **changes) if changes else insn


_ELEM_MEMS = (MEM_UOP, MEM_WGT, MEM_INP, MEM_ACC, MEM_ACC_8BIT, MEM_OUT)
"""The memory types a LOAD may name (every one has an element size)."""


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

    def prepare(self, cfg: Any) -> None:
        """Build (or load from the cache) the simulator of ``cfg`` before the first program, so it is timed apart."""
        self.model(cfg)

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
