"""Event counts of a program without running it: the functional simulator's statistics, named as in
:mod:`vta.counters`.

A VTA program has no branches: every instruction runs once, so each statistic is a sum over the instruction list
(``y_size * x_size * element bytes`` per LOAD and STORE, ``iter_out * iter_in * (uop_end - uop_bgn)`` micro-ops per
GEMM and ALU, MACs for the non-reset GEMMs). ``tests/test_sweep_energy.py`` checks them against
:func:`vta.fsim.run` on compiled layers.
"""
from __future__ import annotations

from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_UOP, MEM_WGT
from vta.counters import BYTE_COUNTERS
from vta.isa import Alu, Gemm, Load, Store
from vta.program import Program

__all__ = ["program_counts", "COUNTED"]

COUNTED = ("gemm_uops", "alu_uops", "macs", *BYTE_COUNTERS.values())
"""The statistics :func:`program_counts` returns (names of :data:`vta.counters.CATALOGUE`)."""

_LOAD_COUNTER = {MEM_UOP: BYTE_COUNTERS["uop"], MEM_WGT: BYTE_COUNTERS["wgt"], MEM_INP: BYTE_COUNTERS["inp"],
                 MEM_ACC: BYTE_COUNTERS["acc"], MEM_ACC_8BIT: BYTE_COUNTERS["acc"]}


def program_counts(program: Program) -> dict[str, int]:
    """Counter name -> count (micro-ops, MACs, bytes) of one run of ``program``; see :data:`COUNTED`."""
    cfg = program.cfg
    counts = dict.fromkeys(COUNTED, 0)
    counts[BYTE_COUNTERS["insn"]] = len(program.insns) * program.insn_bytes
    for insn in program.insns:
        if isinstance(insn, Load):
            counts[_LOAD_COUNTER[insn.mem]] += insn.y_size * insn.x_size * cfg.elem_bytes(insn.mem)
        elif isinstance(insn, Store):
            counts[BYTE_COUNTERS["out"]] += insn.y_size * insn.x_size * cfg.elem_bytes(insn.mem)
        elif isinstance(insn, (Gemm, Alu)):
            uops = insn.iter_out * insn.iter_in * max(0, insn.uop_end - insn.uop_bgn)
            if isinstance(insn, Gemm):
                counts["gemm_uops"] += uops
                if not insn.reset or cfg.gemm_overwrite:  # a gemm_overwrite reset multiplies too
                    counts["macs"] += uops * cfg.macs_per_cycle
            else:
                counts["alu_uops"] += uops
    return counts
