"""The ``tsim`` backend: runs a :class:`~vta.program.Program` on the Verilator model of the generated core.

Same interface as the functional simulator's backend (``vta.backend.get_backend('tsim')``): ``run(program,
**options) -> RunResult(backend, dram, stats, cycles, counters)``. The model for the program's config is built (or
taken from the cache) on first use and kept loaded by the backend instance.

Options of :meth:`TSimBackend.run`:
    max_cycles: cycle budget, 0 for none (default 0).
    watchdog_cycles: cycles without progress before the run stops with a report (default 100_000; 0: off).
    trace: waveform file (``.fst`` or ``.vcd``); the model is then built with trace support.
    trace_window: ``(first, end)`` cycles to record (default: all).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from vta.backend import Backend, RunResult
from vta.config import VTAConfig
from vta.counters import INSN_COUNTERS, STAT_COUNTERS
from vta.isa import TOKEN_POPS, TOKEN_PUSHES

from .bridge import Model, RunOutput
from .build import Build, build

__all__ = ["TSimBackend", "stats_from_counters", "STAT_COUNTERS", "INSN_COUNTERS"]

# STAT_COUNTERS (micro-ops and bytes) and INSN_COUNTERS (instructions per module): the hardware counters that equal
# the functional simulator's statistics on the same program; defined in vta.counters, exported here as before.

DEFAULT_WATCHDOG = 100_000

# module -> instruction flag -> the fsim statistic it counts towards ("<queue>_pops" / "<queue>_pushes")
_TOKEN_FLAGS = {m: {**{f: f"{q}_pops" for f, q in TOKEN_POPS[m].items()},
                    **{f: f"{q}_pushes" for f, q in TOKEN_PUSHES[m].items()}} for m in TOKEN_POPS}


def stats_from_counters(counters: dict[str, int], program: Any = None) -> dict[str, int]:
    """The functional simulator's statistics from the core's counters.

    Measured by the hardware: micro-op counts, bytes moved by kind (:data:`STAT_COUNTERS`) and instructions per
    module. With ``program`` (which ran to FINISH) also the figures that follow from its instruction stream:
    ``macs`` (``BATCH*BLOCK_IN*BLOCK_OUT`` per micro-op of a non-reset GEMM: measured GEMM micro-ops minus the
    reset GEMMs' micro-ops) and the token pushes and pops of each queue (one per flag set on an executed
    instruction), with the functional simulator's names.
    """
    stats = {name: int(counters[name]) for name in STAT_COUNTERS + INSN_COUNTERS}
    if program is None:
        return stats
    from vta.isa import Gemm, module_of
    reset_uops = 0
    tokens = {name: 0 for flags in _TOKEN_FLAGS.values() for name in flags.values()}
    for insn in program.insns:
        if isinstance(insn, Gemm) and insn.reset:
            reset_uops += insn.iter_out * insn.iter_in * max(0, insn.uop_end - insn.uop_bgn)
        for flag, name in _TOKEN_FLAGS[module_of(insn)].items():
            tokens[name] += int(bool(getattr(insn, flag)))
    stats["macs"] = (stats["gemm_uops"] - reset_uops) * program.cfg.macs_per_cycle
    stats.update(tokens)
    return stats


class TSimBackend(Backend):
    """Cycle-accurate RTL co-simulation in Verilator. ``generator``/``sources`` swap the RTL (tests use a stand-in
    core); by default the core comes from ``vta.hw.verilog``."""

    name = "tsim"

    def __init__(self, *, generator: Callable[[VTAConfig, Path], Path] | None = None,
                 sources: list[Path] | None = None, progress: bool | None = None) -> None:
        self._generator = generator
        self._sources = sources
        self._progress = progress
        self._models: dict[tuple[VTAConfig, str], Model] = {}

    def model(self, cfg: VTAConfig, trace: str = "none") -> Model:
        """The loaded model for ``cfg`` (built or taken from the cache on first use)."""
        key = (cfg, trace)
        if key not in self._models:
            built: Build = build(cfg, trace=trace, generator=self._generator, sources=self._sources,
                                 progress=self._progress)
            self._models[key] = Model(built)
        return self._models[key]

    def run_raw(self, program: Any, *, max_cycles: int = 0, watchdog_cycles: int = DEFAULT_WATCHDOG,
                trace: str | Path | None = None, trace_window: tuple[int, int] | None = None
                ) -> tuple[np.ndarray, RunOutput]:
        """Run ``program`` and return the final DRAM image and the harness's :class:`~vta.tsim.bridge.RunOutput`."""
        cfg = program.cfg
        if not isinstance(cfg, VTAConfig):
            raise TypeError(f"program.cfg must be a VTAConfig, not {type(cfg).__name__}")
        kind = "none"
        if trace is not None:
            suffix = Path(trace).suffix.lower()
            if suffix not in (".fst", ".vcd"):
                raise ValueError(f"the trace file must end in .fst or .vcd, not {str(trace)!r}")
            kind = suffix[1:]
        return self.model(cfg, kind).run_program(program, max_cycles=max_cycles, watchdog_cycles=watchdog_cycles,
                                                 trace=trace, trace_window=trace_window)

    def run(self, program: Any, **options: Any) -> RunResult:
        """Run ``program`` to FINISH; see the module docstring for ``options``. Raises a
        :class:`~vta.tsim.bridge.TsimError` subclass when the run does not reach FINISH."""
        known = {"max_cycles", "watchdog_cycles", "trace", "trace_window"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown tsim option(s) {', '.join(unknown)}; known options are "
                            f"{', '.join(sorted(known))}")
        dram, out = self.run_raw(program, **options)
        return RunResult(backend=self.name, dram=dram, stats=stats_from_counters(out.counters, program),
                         cycles=out.counters["cycles"], counters=out.counters)
