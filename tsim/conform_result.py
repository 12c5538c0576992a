"""What the conformance kit reports for one feature (:class:`Outcome`) and how a finished run is judged against fsim
(:func:`result_problems`), apart from :mod:`vta.tsim.conform` so that the kit's case modules
(:mod:`vta.tsim.conform_host`) and the kit itself share them without importing each other."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vta.config import MEM_OUT
from vta.program import Program

from .conform_timing import progress_after_done, timing_counter_problems

__all__ = ["Outcome", "result_problems"]


@dataclass(frozen=True)
class Outcome:
    """One feature's result: ``status`` is ``pass``, ``fail`` (a result differs from fsim's), ``hang`` (the watchdog
    or the cycle budget stopped the run) or ``error`` (the run failed otherwise, e.g. a memory access outside the
    image); ``detail`` says what differed; ``cycles`` the core's cycles when it finished."""

    feature: str
    status: str
    detail: str = ""
    cycles: int | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def _store_of(program: Program, address: int) -> str:
    """The last STORE (in program order) whose DRAM rows contain byte ``address``, as ``instruction k (...)``."""
    from vta.asm import format_insn
    from vta.isa import Store
    eb = program.cfg.elem_bytes(MEM_OUT)
    for k in range(len(program.insns) - 1, -1, -1):
        insn = program.insns[k]
        if not isinstance(insn, Store) or not insn.x_size:
            continue
        for row in range(insn.y_size):
            lo = (insn.dram_base + row * insn.x_stride) * eb
            if lo <= address < lo + insn.x_size * eb:
                return f"instruction {k} ({format_insn(insn)})"
    return "no STORE writes there"


def _unfinished(program: Program, counters: dict[str, int]) -> str:
    """The modules that did not finish their share of ``program`` by the counters (``<module>_insns``), each with
    the instruction it stopped at: ``"compute finished 3 of 5 instructions, stopped at instruction 7 (GEMM ...)"``."""
    from vta.asm import format_insn
    from vta.counters import MODULES
    from vta.isa import module_of
    routed: dict[str, list[int]] = {m: [] for m in MODULES}
    for k, insn in enumerate(program.insns):
        routed["fetch"].append(k)
        routed[module_of(insn)].append(k)
    parts = []
    for module, indices in routed.items():
        done = int(counters.get(f"{module}_insns", 0))
        if done < len(indices):
            k = indices[done]
            parts.append(f"{module} finished {done} of {len(indices)} instructions, stopped at instruction {k} "
                         f"({format_insn(program.insns[k])})")
    return "; ".join(parts) or "every module finished its instructions, yet done never rose"


def result_problems(program: Program, expected: Any, dram: np.ndarray, out: Any, latency: int | None) -> list[str]:
    """What differs between a core's finished run of ``program`` (its final ``dram`` and
    :class:`~vta.tsim.bridge.RunOutput` ``out``, at read latency ``latency`` cycles, None: the config's) and fsim's
    result ``expected``: the first differing DRAM byte (its allocation and STORE), the statistics that differ, the
    timing counters' problems and progress after ``done``; empty when the run conforms."""
    from .backend import stats_from_counters
    from .compare import compare_dram, locate
    stats = stats_from_counters(out.counters, program)
    want = expected.stats.as_dict()
    problems = []
    mismatch = compare_dram(expected.dram, dram)
    if mismatch is not None:
        problems.append(f"{mismatch}, in {locate(mismatch.address, program.allocations)}, written by "
                        f"{_store_of(program, mismatch.address)}")
    differing = [f"{k} {want.get(k, 0):,} vs {stats.get(k, 0):,}" for k in sorted(want.keys() | stats.keys())
                 if want.get(k, 0) != stats.get(k, 0)]
    if differing:
        problems.append("statistics differ (fsim vs core): " + ", ".join(differing))
    run_latency = program.cfg.dram_latency if latency is None else latency
    problems += timing_counter_problems(out.counters, out.cycles, program, run_latency)
    late = progress_after_done(out.drain_cycles, run_latency)
    if late is not None:
        problems.append(late)
    return problems
